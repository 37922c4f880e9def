"""Tensor names as the recorder writes them: wrapper parts dropped. No torch here, so that
`tracekit import` (which renames the same way) never imports it."""

# Wrapper modules insert these path components; dropping them lets a DDP, FSDP, compiled or plain
# run of the same model name its tensors the same way.
_WRAPPER_PARTS = {"module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}


def canonical_name(name: str) -> str:
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS]
    return ".".join(parts) or name
