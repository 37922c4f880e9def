"""Where a store lives: a local folder, or a URL (s3://, memory://, any fsspec scheme) plus storage options.

`resolve(target, storage_options)` turns what a user typed into a `Location`, which hands out the
zarr store to open (zarr's LocalStore for folders; for s3:// zarr's ObjectStore over obstore, or
zarr's FsspecStore over s3fs, see ENV_S3_CLIENT; FsspecStore for other URLs) and a few
whole-object operations on it (read a key, does a key exist, its size, put immutable objects,
is the prefix empty, clear). Storage
options are spelled as fsspec spells them, as `xarray.open_datatree(url, engine="zarr",
storage_options=...)` takes them, whichever client serves the URL.

Credentials: the standard AWS chain (environment, profile, instance role) is what s3fs uses when no
key is given; `--storage-option KEY=VALUE` adds fsspec options (`key`, `secret`, `endpoint_url`,
`client_kwargs.region_name`, ...), and AWS_ENDPOINT_URL in the environment sets the endpoint.
Options are kept only in memory: `str()`/`repr()` of a Location show the URL alone, and nothing
here writes them anywhere. The recorder's ranks receive them in the environment variable
TRACEKIT_STORAGE_OPTIONS, set by the launcher for its child only.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Mapping

from tracekit.errors import StoreError, UsageError

ENV_STORAGE_OPTIONS = "TRACEKIT_STORAGE_OPTIONS"
# Which of zarr's store classes serves s3:// URLs: "obstore" (zarr's ObjectStore: 2-9x the throughput
# of s3fs in bench/bench_objstore.py), "fsspec" (zarr's FsspecStore over s3fs: botocore's full credential
# chain, profiles included, and any s3fs option), or "auto" (default): obstore when it is installed,
# no AWS_PROFILE is set and every storage option is one it understands; fsspec otherwise.
ENV_S3_CLIENT = "TRACEKIT_S3_CLIENT"
# fsspec option -> obstore S3 config key, for the options both clients know
_OBSTORE_KEYS = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token",
                 "endpoint_url": "endpoint", "region_name": "region"}
# Every object-store request ends within this many seconds (TRACEKIT_S3_TIMEOUT), retries included:
# a hung or dead endpoint is one line ("cannot reach ENDPOINT: ...") instead of minutes of retries.
ENV_S3_TIMEOUT = "TRACEKIT_S3_TIMEOUT"
DEFAULT_S3_TIMEOUT = 30.0
S3_RETRIES = 2  # at most, and only while the first attempt began less than the timeout ago
# Schemes that name a local folder; everything else with "://" goes to fsspec.
_LOCAL_SCHEMES = ("file",)
# Object PUTs (with their HEADs) in flight at once per put_missing call: a step's objects go up
# together instead of one request round trip after another (bench/bench_objstore.py).
PUT_CONCURRENCY = 16


def is_url(target) -> bool:
    """True for a URL of a remote or in-memory store (s3://, memory://, ...), False for a local path."""
    if isinstance(target, Location):
        return not target.is_local
    text = os.fspath(target) if not isinstance(target, str) else target
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme.lower() not in _LOCAL_SCHEMES


def parse_storage_options(items) -> dict[str, Any]:
    """["KEY=VALUE", ...] -> options; `a.b=v` nests ({"a": {"b": v}}); true/false/null/numbers as JSON."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, raw = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--storage-option {item.split('=')[0]!r}: expected KEY=VALUE")
        try:
            value = json.loads(raw) if raw in ("true", "false", "null") or _is_number(raw) else raw
        except ValueError:
            value = raw
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise UsageError(f"--storage-option {key}: {p} is given both as a value and as a group")
        node[parts[-1]] = value
    return out


def _is_number(raw: str) -> bool:
    try:
        float(raw)
    except ValueError:
        return False
    return True


def _merge(base: Mapping, extra: Mapping) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _env_options() -> dict:
    raw = os.environ.get(ENV_STORAGE_OPTIONS)
    if not raw:
        return {}
    try:
        opts = json.loads(raw)
    except ValueError:
        raise UsageError(f"{ENV_STORAGE_OPTIONS} is not valid JSON") from None
    if not isinstance(opts, dict):
        raise UsageError(f"{ENV_STORAGE_OPTIONS} must hold a JSON object")
    return opts


@dataclass(frozen=True)
class Location:
    """A store's place. `url` is an absolute folder path for local stores; never holds credentials."""

    url: str
    options: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_local(self) -> bool:
        return not is_url(self.url)

    @property
    def path(self) -> str | None:
        """The local folder, or None for a URL."""
        return self.url if self.is_local else None

    @property
    def scheme(self) -> str:
        return "file" if self.is_local else self.url.partition("://")[0].lower()

    def __str__(self) -> str:
        return self.url

    def __fspath__(self) -> str:
        if not self.is_local:
            raise TypeError(f"{self.url} is not a local path")
        return self.url

    def join(self, *keys: str) -> str:
        """A human-readable name of an object or folder inside the store (for messages)."""
        sep = os.sep if self.is_local else "/"
        return sep.join([self.url.rstrip(sep), *keys])

    def zarr_store(self, read_only: bool = False):
        """The zarr store object for this location."""
        from zarr.storage import FsspecStore, LocalStore

        if self.is_local:
            return LocalStore(self.url, read_only=read_only)
        if self.scheme in ("s3", "s3a") and _use_obstore(self.options):
            return _obstore_s3(self, read_only)
        options = dict(self.options)
        if self.scheme in ("s3", "s3a"):  # botocore's bounds, as obstore's above (the user's own settings win)
            t = s3_timeout()
            config = dict(options.get("config_kwargs") or {})
            for k, v in (("connect_timeout", t), ("read_timeout", t), ("retries", {"max_attempts": S3_RETRIES + 1})):
                config.setdefault(k, v)
            options["config_kwargs"] = config
        try:
            return FsspecStore.from_url(self.url, storage_options=options or None, read_only=read_only)
        except ImportError as e:
            raise StoreError(f"{self.url}: the {self.scheme}:// scheme needs a package not installed here ({e.name or e}); "
                             "for s3:// install s3fs") from None
        except (ValueError, TypeError) as e:
            raise UsageError(f"{self.url}: bad storage options ({e.__class__.__name__}: {e})") from None

    # Whole-object operations, run through zarr's store so one code path serves every scheme.

    def read_bytes(self, key: str) -> bytes | None:
        """The object at `key` under the store, or None if there is none."""
        if self.is_local:
            try:
                with open(os.path.join(self.url, key), "rb") as f:
                    return f.read()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return None
        from zarr.core.buffer import default_buffer_prototype

        buf = _sync(self, self._remote().get(key, prototype=default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    def exists(self, key: str) -> bool:
        if self.is_local:
            return os.path.isfile(os.path.join(self.url, key))
        return bool(_sync(self, self._remote().exists(key)))

    def size(self, key: str) -> int | None:
        """The size of the object at `key` (one HEAD request on an object store); None if there is none."""
        if self.is_local:
            try:
                return os.stat(os.path.join(self.url, key)).st_size
            except (FileNotFoundError, NotADirectoryError):
                return None
        store = self._remote()

        async def head():
            try:
                return await store.getsize(key)
            except FileNotFoundError:
                return None

        size = _sync(self, head())
        return None if size is None else int(size)

    def put_missing(self, items) -> int:
        """PUT each (key, bytes-like) of `items` whose key is not in the store yet; the number put.

        For immutable, content-addressed objects: a HEAD first, so bytes already stored (by another
        rank, at an earlier step) are not uploaded again; two writers racing on one key put the
        same bytes, and a PUT replaces an object whole, so no reader sees a mix. The requests of
        all items run concurrently, at most PUT_CONCURRENCY at a time. URL stores only."""
        import asyncio

        from zarr.core.buffer import default_buffer_prototype

        items = list(items)
        if not items:
            return 0
        store = self._remote()
        to_buffer = default_buffer_prototype().buffer.from_bytes
        limit = asyncio.Semaphore(PUT_CONCURRENCY) if PUT_CONCURRENCY else None

        async def one(key, data) -> bool:
            async with limit or contextlib.nullcontext():
                if await store.exists(key):
                    return False
                await store.set(key, to_buffer(data))
                return True

        async def every():
            return await asyncio.gather(*(one(k, d) for k, d in items))

        return sum(_sync(self, every()))

    def is_empty(self) -> bool:
        """True when nothing is stored under the location (a missing folder or prefix counts as empty)."""
        if self.is_local:
            return not os.path.exists(self.url) or (os.path.isdir(self.url) and not os.listdir(self.url))
        return bool(_sync(self, self._remote().is_empty("")))

    def size_under(self, prefix: str = "") -> int:
        """Bytes stored under a key prefix ("" for the whole store)."""
        if self.is_local:
            return _local_size(os.path.join(self.url, prefix) if prefix else self.url)
        return int(_sync(self, self._remote().getsize_prefix(prefix)) or 0)

    def sizes_under(self, prefixes) -> tuple[dict[str, int], int]:
        """({prefix: bytes stored under it}, bytes of the whole store) for top-level names (a
        store's rank groups): a local store is walked once, not once per prefix and again whole
        (`tracekit show` of a 64-rank store walked its ~25,000 folders twice)."""
        prefixes = list(prefixes)
        if not self.is_local:
            return {p: self.size_under(p) for p in prefixes}, self.size_under()
        try:
            children = list(os.scandir(self.url))
        except OSError:
            return {p: 0 for p in prefixes}, 0
        sizes = {}
        for entry in children:
            size = _entry_size(entry)
            sizes[entry.name] = _local_size(entry.path) if size is None else size
        return {p: sizes.get(p, 0) for p in prefixes}, sum(sizes.values())

    def clear(self, keep: tuple[str, ...] = ()) -> None:
        """Delete everything under the location (only ever after checking it holds a tracekit store),
        except, for a URL store, the top-level names in `keep` (the job's claim)."""
        if self.is_local:
            import shutil

            shutil.rmtree(self.url)
            return
        store = self._remote()
        if not keep:
            _sync(self, store.delete_dir(""))
            return
        tops = {k.split("/", 1)[0]: "/" in k for k in self.keys()}
        for name, is_dir in sorted(tops.items()):
            if name not in keep:
                _sync(self, store.delete_dir(name) if is_dir else store.delete(name))

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under `prefix` (URL stores)."""
        store = self._remote()

        async def listed():
            return [k async for k in store.list_prefix(prefix)]

        return _sync(self, listed())

    def put_if_absent(self, key: str, data: bytes) -> bool | None:
        """Create the object `key` only if there is none (S3's conditional PUT, If-None-Match: *):
        True if created, False if one exists; None where this client has no conditional write
        (the fsspec client). URL stores only."""
        inner = getattr(self._remote(), "store", None)
        try:
            import obstore
            from obstore.exceptions import AlreadyExistsError
            from obstore.store import S3Store
        except ImportError:
            return None
        if not isinstance(inner, S3Store):
            return None

        # obstore's blocking put, not put_async on zarr's event loop: a refused claim ends the
        # command at once, and an async call's completion arriving from obstore's threads while
        # the interpreter shuts down is a suspect for the one SIGABRT seen at that exit in CI
        try:
            obstore.put(inner, key, data, mode="create")
        except AlreadyExistsError:
            return False
        except Exception as e:  # unreachable endpoint, access denied: one line, as _sync says it
            raise remote_error(e, self) from None
        return True

    def delete(self, key: str) -> None:
        """Delete the object `key` if there is one (URL stores)."""
        _sync(self, self._remote().delete(key))

    def __getstate__(self):  # travels to Dask workers as URL and options, without the open store
        return {"url": self.url, "options": dict(self.options)}

    def __setstate__(self, state):
        object.__setattr__(self, "url", state["url"])
        object.__setattr__(self, "options", state["options"])

    def _remote(self):
        store = self.__dict__.get("_store")
        if store is None:
            store = self.zarr_store()
            object.__setattr__(self, "_store", store)  # cached: one filesystem/connection pool per Location
        return store


def _use_obstore(options: Mapping) -> bool:
    choice = os.environ.get(ENV_S3_CLIENT, "auto").lower()
    if choice not in ("auto", "obstore", "fsspec"):
        raise UsageError(f"{ENV_S3_CLIENT} must be auto, obstore or fsspec, not {choice!r}")
    if choice != "auto":
        return choice == "obstore"
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    flat = {**options, **(options.get("client_kwargs") or {})}
    flat.pop("client_kwargs", None)
    return not os.environ.get("AWS_PROFILE") and all(k in _OBSTORE_KEYS or k == "anon" for k in flat)


def _obstore_s3(location: Location, read_only: bool):
    """zarr's ObjectStore over obstore's S3Store, from the same fsspec-style options (AWS_* env vars too)."""
    try:
        from obstore.store import S3Store
        from zarr.storage import ObjectStore
    except ImportError:
        raise StoreError(f"{ENV_S3_CLIENT}=obstore needs the obstore package") from None
    options = dict(location.options)
    options.update(options.pop("client_kwargs", None) or {})
    config = {}
    for k, v in options.items():
        if k == "anon":
            config["skip_signature"] = bool(v)
        elif k in _OBSTORE_KEYS:
            config[_OBSTORE_KEYS[k]] = v
        else:
            raise UsageError(f"storage option {k!r} is not one the obstore client takes (use {ENV_S3_CLIENT}=fsspec)")
    endpoint = config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL", "")
    bucket, _, prefix = location.url.partition("://")[2].partition("/")
    timeout = timedelta(seconds=s3_timeout())
    client = {"timeout": timeout, "connect_timeout": timeout, **({"allow_http": True} if endpoint.startswith("http://") else {})}
    # obstore retries for up to 3 minutes by default: a hung endpoint took 181 s to report
    retry = {"max_retries": S3_RETRIES, "retry_timeout": timeout,
             "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timeout / 4, "base": 2}}
    try:
        store = S3Store(bucket, prefix=prefix or None, config=config, client_options=client, retry_config=retry)
    except Exception as e:  # incomplete credentials, a bad endpoint: one line, without the values
        raise StoreError(f"{location.url}: cannot set up the S3 client ({str(e).splitlines()[0]})") from None
    from tracekit.store.obstore_exit import guard_exit

    guard_exit()  # else a command that ends right after a request can abort at exit (obstore_exit.py)
    return ObjectStore(store, read_only=read_only)


def s3_timeout() -> float:
    raw = os.environ.get(ENV_S3_TIMEOUT)
    if raw is None:
        return DEFAULT_S3_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{ENV_S3_TIMEOUT}={raw!r}: expected a finite number of seconds, above 0")
    return value


# Words of an error that mean the endpoint never answered (obstore's and botocore's/aiohttp's).
_UNREACHABLE = ("timed out", "timeout", "connection refused", "connect error", "error sending request",
                "could not connect", "cannot connect", "connection reset", "connectionerror", "broken pipe",
                "endpoint url", "name or service not known", "dns error")


def remote_error(e: BaseException, location: "Location | None" = None) -> StoreError:
    """One line for an object-store client's error: "cannot reach ENDPOINT: ..." when the endpoint did
    not answer (hung, killed, unresolvable), else "object store error (...)". Never the client's
    multi-line debug dump: its first line only, cut short."""
    text = f"{e.__class__.__name__}: {e}"
    first = " ".join(str(e).split("\n", 1)[0].split())[:200] or e.__class__.__name__
    if isinstance(e, (TimeoutError, ConnectionError)) or any(w in text.lower() for w in _UNREACHABLE):
        return StoreError(f"cannot reach {endpoint_of(location)}: {first}")
    return StoreError(f"object store error ({e.__class__.__name__}: {first})")


def endpoint_of(location: "Location | None") -> str:
    """The endpoint a location's requests go to, for messages (never credentials)."""
    options = dict(location.options) if location is not None else {}
    options.update(options.pop("client_kwargs", None) or {})
    endpoint = options.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        return str(endpoint)
    return f"the {location.scheme}:// service" if location is not None else "the object store"


def _sync(location: "Location | None", coro):
    from zarr.core.sync import sync

    try:
        return sync(coro)
    except (StoreError, UsageError):
        raise
    except Exception as e:  # no such bucket, access denied, no credentials, unreachable endpoint
        raise remote_error(e, location) from None


def resolve(target, storage_options: Mapping | None = None) -> Location:
    """A path, a URL or a Location -> a Location. Local paths become absolute; `file://` URLs become paths.

    For URLs the options are: TRACEKIT_STORAGE_OPTIONS from the environment, then `storage_options`;
    for s3:// an AWS_ENDPOINT_URL in the environment is the endpoint unless an option names one."""
    if isinstance(target, Location):
        if storage_options:
            return Location(target.url, _merge(target.options, storage_options))
        return target
    text = os.fspath(target)
    if not is_url(text):
        if text.startswith("file://"):
            text = text[len("file://"):]
        return Location(os.path.abspath(text))
    if "@" in text.partition("://")[2].split("/", 1)[0]:
        # s3://KEY:SECRET@bucket would put a secret into every message and log line that names the store
        raise UsageError("credentials in a store URL are refused; use the AWS credential chain or --storage-option")
    options = _merge(_merge(_env_options(), _scoped.get()), storage_options or {})
    scheme = text.partition("://")[0].lower()
    if scheme in ("s3", "s3a") and os.environ.get("AWS_ENDPOINT_URL") and not _names_endpoint(options):
        options["endpoint_url"] = os.environ["AWS_ENDPOINT_URL"]
    return Location(text.rstrip("/"), options)


_scoped: contextvars.ContextVar[Mapping] = contextvars.ContextVar("tracekit_storage_options", default={})


@contextlib.contextmanager
def storage_options_scope(options: Mapping):
    """Within the block, every URL resolved gets `options` (over the environment's); the CLI's --storage-option."""
    token = _scoped.set(_merge(_scoped.get(), options))
    try:
        yield
    finally:
        _scoped.reset(token)


def child_env() -> dict[str, str]:
    """Environment entries that give a child process (a recording rank) the storage options in force here."""
    options = _merge(_env_options(), _scoped.get())
    return {ENV_STORAGE_OPTIONS: json.dumps(options)} if options else {}


def _names_endpoint(options: Mapping) -> bool:
    client = options.get("client_kwargs") or {}
    return "endpoint_url" in options or (isinstance(client, Mapping) and "endpoint_url" in client)


def canonical(target) -> str:
    """The name a store is recorded and compared under: the absolute path of a folder, a URL as given."""
    if isinstance(target, Location):
        return target.url
    text = os.fspath(target)
    if is_url(text):
        return text.rstrip("/")
    return os.path.abspath(text[len("file://"):] if text.startswith("file://") else text)


def same_store(a, b) -> bool:
    """Whether two names denote the same store (folders compared after resolving links)."""
    a, b = canonical(a), canonical(b)
    if is_url(a) or is_url(b):
        return a == b
    return os.path.realpath(a) == os.path.realpath(b)


def _entry_size(entry: os.DirEntry) -> int | None:
    """A file's bytes (a link followed, as getsize does); None for a folder to walk into; 0 for a
    link to a folder (os.walk lists it and does not follow it) or a file vanishing mid-walk (a run
    still writing is no error)."""
    try:
        if entry.is_dir():
            return 0 if entry.is_symlink() else None
        return entry.stat().st_size
    except OSError:
        return 0


def _local_size(folder: str) -> int:
    """Bytes of the files below a local folder (scandir: no path joins, no stat of folders)."""
    total, stack = 0, [folder]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:  # gone mid-walk, or not a folder
            continue
        for entry in entries:
            size = _entry_size(entry)
            if size is None:
                stack.append(entry.path)
            else:
                total += size
    return total
