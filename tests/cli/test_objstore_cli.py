"""The commands on stores in a bucket of a loopback S3 server (moto): record, diff, show, loss,
export, import, plain xarray; credentials never land in a store or an output."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

from conftest import run_recorded
from tracekit import open_store
from tracekit.cli.main import main

TINY = os.path.join(os.path.dirname(__file__), "scripts", "tiny_train.py")


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.mark.torchrun
def test_a_two_rank_recording_straight_into_a_bucket(s3, recorded_sample, tmp_path, monkeypatch):
    url = s3.url("runs/ref")
    recorded = run_recorded(url, "tutorial", "ddp", extra=["--steps", "3"])
    local, _ = recorded_sample("ddp")
    store = open_store(url)
    assert store.ranks == [0, 1] and store.finished and store.meta["exit_status"] == 0
    assert all(store.rank(r).completed_steps == [1, 2, 3] for r in store.ranks)

    outputs = [recorded.stdout, recorded.stderr]
    code, out = cli("diff", "--exact", url, local)
    outputs.append(out)
    assert code == 0 and out.splitlines()[-1] == "PASS comparison ranks=2 steps=3", out

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

    # export from the bucket, import back into it, and read the imported step
    code, out = cli("export", url, "--rank", "1", "--step", "2", "-o", tmp_path / "r1s2.safetensors")
    outputs.append(out)
    assert code == 0, out
    code, out = cli("import", tmp_path / "r1s2.safetensors", "-o", s3.url("imported"))
    outputs.append(out)
    assert code == 0, out
    imported = open_store(s3.url("imported"))
    assert imported.ranks == [1]  # the exported file says which rank it came from
    back = imported.rank(1).read_kind("parameters", imported.rank(1).steps("parameters")[-1])
    original = store.rank(1).read_kind("parameters", 2)
    assert back.keys() == original.keys()
    assert all(np.array_equal(back[k], original[k]) for k in original)

    tree = xr.open_datatree(url, engine="zarr", storage_options={"endpoint_url": s3.endpoint})
    assert sorted(tree.children) == ["rank_0", "rank_1"]
    grads = store.rank(1).read_kind("gradients", 2)
    packed = tree["rank_1/gradients"]["float32"].values[1]
    first = store.rank(1).tensors("gradients")[0]
    np.testing.assert_array_equal(packed[first.offset: first.offset + first.numel], grads[first.name].ravel())

    blobs = s3.objects()
    assert not any(s3.secret.encode() in b for b in blobs.values())
    assert not any(s3.secret in text for text in outputs)


@pytest.mark.torchrun
def test_a_rank_killed_mid_run_against_the_bucket_leaves_its_completed_steps(s3):
    url = s3.url("runs/killed")
    result = subprocess.run(
        [sys.executable, "-m", "tracekit.cli.main", "record", "-o", url, "--", sys.executable, "-m",
         "torch.distributed.run", "--standalone", "--nproc-per-node=2", TINY, "--steps", "4", "--die-rank", "1",
         "--die-step", "3"], capture_output=True, text=True, timeout=240)
    assert result.returncode != 0
    store = open_store(url)
    assert store.meta["exit_status"] == result.returncode
    dead = store.rank(1)
    assert dead.completed_steps == [1, 2]
    assert dead.status == "killed" and dead.cause == "killed by SIGKILL"  # its writer process stored steps 1-2
    assert dead.read("loss", 2, "loss").shape == ()
    code, out = cli("diff", "--allow-missing", url, url)
    assert code == 0, out
    assert s3.secret not in result.stdout + result.stderr + out


def test_record_refuses_a_foreign_prefix_in_one_line(s3):
    s3.fs.pipe_file(f"{s3.bucket}/notes/a.txt", b"mine")
    code, out = cli("record", "-o", s3.url("notes"), "--force", "--", "true")
    assert code == 2 and "not a tracekit store; refusing" in out and "Traceback" not in out
    assert s3.fs.cat_file(f"{s3.bucket}/notes/a.txt") == b"mine"


def test_a_bad_storage_option_is_one_line(s3):
    code, out = cli("show", "--storage-option", "novalue", s3.url("x"))
    assert code == 2 and "expected KEY=VALUE" in out


def test_report_of_two_bucket_stores(s3, tmp_path):
    from tracekit.testing import write_store

    def run(scale):
        return {r: {s: {"loss": {"loss": np.float32(1 / s)},
                        "gradients": {"w": np.full(6, s * scale, np.float32)}} for s in (1, 2)} for r in (0, 1)}

    ref, cand = write_store(s3.url("ref"), run(1.0)), write_store(s3.url("cand"), run(1.5))
    html = tmp_path / "r.html"
    code, out = cli("report", ref, cand, "-o", html)
    assert code == 1, out  # the gradients differ by half
    assert out.splitlines()[0].startswith("FAIL comparison ranks=2 steps=2")
    page = html.read_text()
    assert ref in page and cand in page
    assert s3.secret not in page + out
