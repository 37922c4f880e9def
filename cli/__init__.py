"""`tracekit`'s command line, one click command per module (shipped as tracekit.cli)."""

if __name__ != "tracekit.cli":  # the checkout's folder imported as itself: a second copy of every module
    raise ImportError(f"{__name__!r} is tracekit's cli/ folder imported by its path; it ships as tracekit.cli: "
                      "import tracekit.cli (pip install -e . from a checkout)")
