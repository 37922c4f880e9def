"""Moved to tracekit.store.dtypes (the store owns its on-disk dtypes); this alias keeps imports of
branches written before the move working. New code imports tracekit.store.dtypes."""

from tracekit.store.dtypes import *  # noqa: F401,F403
from tracekit.store.dtypes import all_finite, is_bit_stored, storage_dtype, to_numpy_values  # noqa: F401
