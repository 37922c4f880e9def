"""--full through the Recorder into a bucket (moto on 127.0.0.1): the rank's writer process PUTs
objects of the matching tensors only, and summaries and hashes of all, as into a folder."""

import torch

from tracekit import open_store
from tracekit.recorders import RecordConfig, Recorder
from tracekit.store.places import located
from tests.recorders import full_runs


def test_full_into_a_bucket_keeps_bytes_of_matching_tensors_only(s3):
    url = s3.url("runs/full")
    model = full_runs.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    grads = {}
    with Recorder(model, opt, config=RecordConfig(store=url, full=("parameters:*,loss:*",))) as rec:
        full_runs.train(model, opt, rec, 2, grads)
    full_runs.check_store(url, grads)
    view = open_store(url).rank(0)
    assert open_store(url).format_version == 6  # summaries and --full: format 2 and later
    # the objects of the kept tensors, or the packs they lie in (format 3)
    kept = {located(view, k, s, t.name).key.split("/", 1)[1].replace("/", "") for k in ("parameters", "loss")
            for s in view.steps(k) for t in view.tensors(k)}
    stored = {k.rsplit("/objects/", 1)[1].replace("/", "") for k in s3.keys() if "/objects/" in k and not k.endswith("zarr.json")}
    assert stored == kept  # no gradient object went up
