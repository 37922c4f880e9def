"""tracekit's zero-code bootstrap. `tracekit record` puts this folder first on PYTHONPATH, so every
Python process of the recorded job imports this file at startup (as ddtrace-run and
opentelemetry-instrument do).

It must stay cheap and harmless: it never imports torch or tracekit itself. It runs the
sitecustomize that would have run without us, and in processes that may train it arranges for
tracekit.recorders.zerocode to load right after the program's own `import torch` finishes. The
settings it reads are set by `tracekit record` (names defined in bootstrap_env.py).
"""

import importlib.machinery
import importlib.util
import os
import sys


def _is_torchrun_agent(argv):
    # The agent only spawns workers (which get RANK); it never trains, so it is left alone.
    args = list(argv[1:])
    if "-m" in args:
        module = args[args.index("-m") + 1:args.index("-m") + 2]
        return module in (["torch.distributed.run"], ["torch.distributed.launch"])
    scripts = [a for a in args if not a.startswith("-")]
    return bool(scripts) and os.path.basename(scripts[0]) in ("torchrun", "torch-distributed-run")


def _start_zero_code():
    try:
        from tracekit.recorders import zerocode
    except Exception as error:
        if os.environ.get("TRACEKIT_STRICT") == "1":
            raise
        print(f"tracekit: zero-code recording is off in this process (rank {os.environ.get('RANK', '-')}): "
              f"cannot load tracekit: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return
    zerocode.install()  # reports its own failures (or raises under --strict)


class _AfterTorchImport:
    """A meta path finder that lets `import torch` run unchanged, then starts the zero-code recorder."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # the finders after us do the real work
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_then_start(module):
                exec_module(module)
                _start_zero_code()

            spec.loader.exec_module = exec_then_start  # this loader instance serves this import only
        return spec


def _chain_next_sitecustomize():
    """Run the sitecustomize this folder hides (the next one on sys.path), as Python would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if (os.environ.get("TRACEKIT_BOOTSTRAP") == "1" and os.environ.get("TRACEKIT_STORE")
        and ("RANK" in os.environ or not _is_torchrun_agent(sys.orig_argv))):
    sys.meta_path.insert(0, _AfterTorchImport())
_chain_next_sitecustomize()
