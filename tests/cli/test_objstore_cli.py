"""The commands on stores in a bucket of a loopback S3 server (moto): record, diff, show, loss,
export, import, plain xarray; credentials never land in a store or an output."""

import numpy as np
import pytest

from tracekit import open_store
from tracekit.store.places import located
from tests.cli.runner import cli


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


def _bucket_run(fault=1.0):
    """Two ranks whose gradients differ (one object each per step) and share their parameters;
    `fault` scales the gradients of step 2."""
    w = np.linspace(-1, 1, 12, dtype=np.float32)
    return {r: {s: {"loss": {"loss": np.float32(1 / s)}, "gradients": {"w": w * s * np.float32(fault if s == 2 else 1) + r},
                    "parameters": {"w": w - np.float32(0.1 * s)}} for s in (1, 2, 3)} for r in (0, 1)}


def test_verify_finds_a_corrupted_object_in_a_bucket_store(s3):
    from tracekit.testing import write_store

    url = write_store(s3.url("ref"), _bucket_run())
    assert open_store(url).format_version == 6  # the current format
    code, out = cli("verify", url)
    assert code == 0 and out.startswith("verify: OK"), out
    loc = located(open_store(url).rank(1), "gradients", 2, "w")  # its own object, or its range of a pack
    obj = f"{s3.bucket}/ref/{loc.key}"
    good = bytearray(s3.fs.cat_file(obj))
    good[loc.base + 47] ^= 0x80  # one flipped bit in w's last byte, same size
    s3.fs.pipe_file(obj, bytes(good))
    code, out = cli("verify", url)
    lines = out.strip().splitlines()
    problems = [line for line in lines if line.startswith("damaged: ")]
    assert code == 2, out
    assert problems == [f"damaged: rank 1 gradients step 2 tensor w: bytes do not match their hash (object {loc.label})"]
    assert lines[-1].startswith(f"verify: 1 problem: {url}") and "Traceback" not in out
    code, out = cli("diff", url, write_store(s3.url("cand"), _bucket_run()), "--check-hashes")
    assert code == 2 and "damaged store" in out and "rank 1 gradients step 2 tensor w" in out, out
    assert "PASS" not in out and "FAIL" not in out


def test_full_keeps_only_matching_bytes_in_a_bucket_store(s3, tmp_path):
    """--full on a bucket: objects of the matching tensors only, summaries and hashes of all; the
    diff against the same run kept whole on disk passes by summaries where bytes are absent."""
    from tracekit.testing import write_store

    url = write_store(s3.url("ref"), _bucket_run(), full=("parameters:*", "loss:*"))
    local = write_store(tmp_path / "local", _bucket_run())
    store = open_store(url)
    view = store.rank(1)
    assert view.group.attrs["full"] == ["parameters:*", "loss:*"]
    assert [t.keeps_bytes for t in view.tensors("gradients")] == [False]
    stored = s3.objects()
    objects = {k.rsplit("/objects/", 1)[1].replace("/", "") for k in stored if "/objects/" in k and not k.endswith("zarr.json")}
    # the files of the kept tensors (their objects, or the packs they lie in) and no others
    kept = {located(store.rank(r), k, s, name).key.split("/", 1)[1].replace("/", "") for r in (0, 1)
            for k in ("parameters", "loss") for s in (1, 2, 3) for name in ("w", "loss") if name in view.digests(k, s)}
    dropped = {store.rank(r).digests("gradients", s)["w"].hex() for r in (0, 1) for s in (1, 2, 3)}
    assert objects == kept and not objects & dropped
    assert sum(len(v) for k, v in stored.items() if "/objects/" in k and not k.endswith("zarr.json")) <= \
        sum(t.stored_nbytes for r in (0, 1) for k in ("parameters", "loss") for s in (1, 2, 3) for t in store.rank(r).tensors(k))
    np.testing.assert_array_equal(view.read("parameters", 2, "w"), _bucket_run()[1][2]["parameters"]["w"])
    code, out = cli("verify", url)
    assert code == 0, out
    code, out = cli("diff", url, local)  # equal hashes decide every tensor, kept or not
    assert code == 0 and out.strip().splitlines()[-1] == "PASS comparison ranks=2 steps=3", out
    code, out = cli("diff", url, write_store(tmp_path / "bad", _bucket_run(fault=1.01)))
    assert code == 1 and out.strip().splitlines()[-1].startswith("FAIL comparison ranks=2 steps=3 violations=2 first_step=2 by_summaries="), out
    assert "compared by summaries (a side kept no bytes" in out


@pytest.mark.parametrize("endpoint", ["hung", "dead"])
def test_an_unreachable_endpoint_is_one_line_within_twice_the_timeout(monkeypatch, endpoint):
    """A hung endpoint (it accepts connections and never answers) took 181 s and printed 'damaged
    store' with ~1 KB of Rust debug output; a dead one (nothing listens) the same dump. Now each
    request ends at TRACEKIT_S3_TIMEOUT, retries included: one line naming the endpoint, exit 2."""
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if endpoint == "hung":
        listener.listen(64)  # the kernel completes the connections; nobody ever reads or answers
    else:
        listener.close()
    timeout_s = 2.0
    for k, v in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_EC2_METADATA_DISABLED": "true",
                 "TRACEKIT_S3_CLIENT": "obstore", "TRACEKIT_S3_TIMEOUT": str(timeout_s)}.items():
        monkeypatch.setenv(k, v)
    try:
        for args in (["show", "s3://b/x"], ["diff", "s3://b/x", "s3://b/y"]):
            started = time.monotonic()
            code, out = cli(*args)
            elapsed = time.monotonic() - started
            assert code == 2 and out.count("\n") == 1, out
            assert out.startswith(f"Error: cannot reach http://127.0.0.1:{port}: "), out
            assert len(out) < 400 and "Traceback" not in out, out
            assert elapsed < 2 * timeout_s, (args, elapsed)
    finally:
        listener.close()


def test_s3_timeout_must_be_a_finite_positive_duration(monkeypatch):
    for bad in ("nan", "inf", "0", "-1", "soon"):
        monkeypatch.setenv("TRACEKIT_S3_TIMEOUT", bad)
        code, out = cli("show", "s3://b/x")
        assert code == 2 and out.startswith("Error: TRACEKIT_S3_TIMEOUT=") and out.count("\n") == 1, out
