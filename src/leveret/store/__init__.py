"""Persistence: what core asks of a store, and the embedded default.

Core decides *what* must be durable and *when* a confirm may go out; a store decides
*how*. Every change is queued on the event loop and written by the store in groups
(one transaction and one fsync per group); :meth:`Store.when_durable` runs a callback on
the loop once everything queued before it is on disk. Reads while the broker serves
(page-ins, the scheduler's window, stream batches and offsets) are requests too: the
store reads on its reader thread and answers on the loop (``Store.request_*``).
"""

from .base import Snapshot, Store, StoredMessage, StoreError
from .lock import DataDirLock, DataDirLocked

__all__ = ["DataDirLock", "DataDirLocked", "Snapshot", "Store", "StoreError", "StoredMessage"]
