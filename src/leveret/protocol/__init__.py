"""Wire protocols: bytes in, calls on :mod:`leveret.core` out."""
