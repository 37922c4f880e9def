"""Hand-made trace events for root-cause tests without torch: a traced tensor as a trace stores it."""


def traced_tensor(stats: dict[str, list], value: str, producer: int | None = None, name: str | None = None) -> dict:
    """A float32 [4, 8] tensor whose summaries are stats[value] and whose hash is the value's own:
    equal values, equal bytes. producer: the index of the event that made it."""
    t = {"shape": [4, 8], "dtype": "float32", "device": "cpu", "stats": stats[value], "hash": f"xxh3_64:{value}"}
    if producer is not None:
        t["producer"] = [producer, 0]
    if name:
        t["name"] = name
    return t
