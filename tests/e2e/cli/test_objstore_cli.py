"""The commands on stores in a bucket of a loopback S3 server (moto): record, diff, show, loss,
export, import, plain xarray; credentials never land in a store or an output."""

import json
import os
import subprocess
import sys

import numpy as np
import xarray as xr

from tracekit import open_store

from tests.cli.runner import cli
from tests.launching import mode_args, run_recorded
from tests.paths import CLI_SCRIPTS, SAMPLES

TINY = os.path.join(CLI_SCRIPTS, "tiny_train.py")


def test_a_rank_killed_mid_run_against_the_bucket_leaves_its_completed_steps(s3):
    """A SIGKILLed torchrun worker keeps the steps before the kill, status `killed` (docs/RELIABILITY.md):
    its writer process stores steps 1-2 after the rank's death, here into a bucket. The launcher
    persists the status, its cause and the exit code, and `show` and `diff` print them (the killed
    cell of tests/e2e/recorders/test_statuses_torchrun.py, the plain sample's crash fault recorded
    zero-code: one launch for both)."""
    url = s3.url("runs/killed")
    # samples/plain (zero-code) with its planted crash: rank 1 SIGKILLs itself at the start of step 3
    result = subprocess.run(
        [sys.executable, "-m", "tracekit.cli.main", "record", "-o", url, "--", sys.executable, "-m",
         "torch.distributed.run", "--standalone", "--nproc-per-node=2", os.path.join(SAMPLES, "plain", "train.py"),
         *mode_args("ddp"), "--steps", "4", "--fault", "crash=1:3:kill"], capture_output=True, text=True, timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode != 0
    store = open_store(url)
    assert store.meta["exit_status"] == result.returncode
    assert store.ranks == [0, 1]
    dead = store.rank(1)
    assert dead.completed_steps == [1, 2]
    assert dead.status == "killed" and dead.cause == "killed by SIGKILL"  # its writer process stored steps 1-2
    assert dead.read("loss", 2, "loss").shape == ()
    assert store.meta["ranks"]["1"]["completed_steps"] == [1, 2]
    assert store.finished  # the launcher finalized it
    final = store.meta["ranks"]["1"]
    assert (final["status"], final["cause"], final["exit_code"]) == ("killed", "killed by SIGKILL", -9)
    # the peer lost its partner mid-collective, or was stopped by torchrun: not finished either
    assert store.rank(0).status in ("failed", "terminated", "killed", "died")
    code, shown = cli("show", url)
    assert code == 0 and "rank 1 killed: killed by SIGKILL" in shown, shown
    code, out = cli("diff", "--allow-missing", url, url)
    assert code == 0, out
    assert "rank 1 killed: killed by SIGKILL" in out
    assert "missing" not in out.splitlines()[-1]  # a store against itself lacks nothing
    assert s3.secret not in result.stdout + result.stderr + out + shown


def test_record_refuses_a_foreign_prefix_in_one_line(s3):
    s3.fs.pipe_file(f"{s3.bucket}/notes/a.txt", b"mine")
    code, out = cli("record", "-o", s3.url("notes"), "--force", "--", "true")
    assert code == 2 and "not a tracekit store; refusing" in out and "Traceback" not in out
    assert s3.fs.cat_file(f"{s3.bucket}/notes/a.txt") == b"mine"


def test_fsdp_recorded_into_a_bucket_keeps_pieces_and_equals_the_recording_on_disk(s3, recorded_sample, tmp_path,
                                                                                   monkeypatch):
    """Format 2 on a bucket: a 2-rank job recorded straight into it, each rank PUTting only its own
    pieces of the sharded tensors (no gather), reads back bit for bit as the same recording in a
    local folder; and every command reads the bucket store: diff (bucket against folder, and bucket
    against bucket with the endpoint as a --storage-option), show, loss, export, import, verify,
    plain xarray. The secret is in no object and no output."""
    url = s3.url("runs/fsdp")
    recorded = run_recorded(url, "tutorial", "fsdp", extra=["--steps", "3"])
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    local, _ = recorded_sample("fsdp")
    remote, disk = open_store(url), open_store(local)
    assert remote.ranks == [0, 1] and remote.finished and remote.meta["exit_status"] == 0
    assert all(remote.rank(r).completed_steps == [1, 2, 3] for r in remote.ranks)
    assert remote.format_version == disk.format_version == 6  # the current format
    pieces = [t for t in remote.rank(0).tensors("parameters") if t.shard is not None]
    assert pieces, "fsdp parameters should be recorded as each rank's pieces"
    outputs = [recorded.stdout, recorded.stderr]
    code, out = cli("diff", "--exact", url, local)
    outputs.append(out)
    assert code == 0 and out.splitlines()[-1] == "PASS comparison ranks=2 steps=3", out
    checked = 0
    for r in disk.ranks:
        for kind in disk.rank(r).kinds:
            for step in disk.rank(r).steps(kind):
                want = disk.rank(r).read_kind(kind, step)
                got = remote.rank(r).read_kind(kind, step)  # assembled from pieces, every object hash-checked
                assert got.keys() == want.keys()
                for name in want:
                    assert got[name].tobytes() == want[name].tobytes(), (r, kind, step, name)
                    checked += 1
    assert checked > 20
    code, out = cli("verify", url)
    outputs.append(out)
    assert code == 0 and out.startswith("verify: OK"), out

    # the same recording in another bucket store (copied from disk), diffed bucket against bucket,
    # with the endpoint given as a --storage-option instead of the environment
    s3.fs.put(local, f"{s3.bucket}/copy", recursive=True)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    code, out = cli("diff", "--exact", "--json-file", tmp_path / "r.json", "--storage-option", f"endpoint_url={s3.endpoint}",
                    url, s3.url("copy"))
    outputs.append(out)
    assert code == 0 and out.splitlines()[-1] == "PASS comparison ranks=2 steps=3", out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ref"]["path"] == url and report["cand"]["path"] == s3.url("copy")
    outputs.append(json.dumps(report))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)

    code, out = cli("show", url)
    outputs.append(out)
    assert code == 0 and url in out
    code, out = cli("loss", url, local)
    outputs.append(out)
    assert code == 0

    # export from the bucket (rank 1's whole tensors, assembled from both ranks' pieces), import back
    # into it, and read the imported step
    code, out = cli("export", url, "--rank", "1", "--step", "2", "-o", tmp_path / "r1s2.safetensors")
    outputs.append(out)
    assert code == 0, out
    code, out = cli("import", tmp_path / "r1s2.safetensors", "-o", s3.url("imported"))
    outputs.append(out)
    assert code == 0, out
    imported = open_store(s3.url("imported"))
    assert imported.ranks == [1]  # the exported file says which rank it came from
    back = imported.rank(1).read_kind("parameters", imported.rank(1).steps("parameters")[-1])
    original = remote.rank(1).read_kind("parameters", 2)
    assert back.keys() == original.keys()
    assert all(np.array_equal(back[k], original[k]) for k in original)

    # plain xarray opens the bucket store: format 2 shows it the index (a 16-byte hash per tensor and
    # step; a whole tensor's, as the rank's outputs are: a piece's hash is not the tensor's)
    tree = xr.open_datatree(url, engine="zarr", storage_options={"endpoint_url": s3.endpoint})
    assert sorted(tree.children) == ["rank_0", "rank_1"]
    hashes = tree["rank_1/outputs"]["hash"].values
    (first,) = remote.rank(1).tensors("outputs")
    assert first.shard is None
    assert hashes[remote.rank(1).steps("outputs").index(2), :16].tobytes() == remote.rank(1).digests("outputs", 2)[first.name]

    blobs = s3.objects()
    assert not any(s3.secret.encode() in b for b in blobs.values())
    assert not any(s3.secret in text for text in outputs)


def test_one_job_per_bucket_prefix_by_a_conditional_create(s3, tmp_path):
    """Two jobs on one S3 prefix both exited 0, the second's metadata over the first's tensors. The
    launcher's claim is now an object created only if absent (If-None-Match: *, which moto honours):
    the second job is refused in one line, --force included; the first job's data stays, and its
    claim goes with it, so a later job may take the store with --force."""
    url, go = s3.url("runs/a"), tmp_path / "go"
    record = [sys.executable, "-m", "tracekit.cli.main", "record"]
    first = subprocess.Popen([*record, "-o", url, "--", sys.executable, TINY, "--steps", "3", "--pause-at", "2",
                              "--pause-file", go], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert any("paused" in line for line in first.stdout), first.stderr.read()
        run_id = open_store(url).meta["run_id"]
        # refused before it launches anything: in this process (CliRunner), not a tracekit process
        code, refused = cli("record", "--force", "-o", url, "--", sys.executable, TINY, "--steps", "5")
        assert code == 2, refused
        (line,) = refused.strip().splitlines()
        assert line.startswith(f"Error: {url} is claimed by another job (run {run_id}") and "--force does not" in line
        go.touch()
        assert first.wait(timeout=120) == 0, first.stderr.read()
    finally:
        first.kill()
    store = open_store(url)
    assert store.meta["run_id"] == run_id and store.rank(0).completed_steps == [1, 2, 3]
    assert not [k for k in s3.keys() if "/.tracekit_job/" in k]  # released with the job (a listing)
    again = subprocess.run([*record, "--force", "-o", url, "--", sys.executable, TINY, "--steps", "2"],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert open_store(url).rank(0).completed_steps == [1, 2]
