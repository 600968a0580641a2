"""The STOMP frame codec's twins (frames.py and _cframes.pyx) as pytest parameters."""

from __future__ import annotations

from compiled_twins import compiled, twin_params

from leveret.protocol.stomp import frames

NAME = "leveret.protocol.stomp._cframes"
PURE = {
    "FrameParser": frames.PyFrameParser,
    "encode": frames.py_encode,
    "escape": frames.py_escape,
    "unescape": frames.py_unescape,
    "message_head": frames.py_message_head,
}
#: ``@pytest.mark.parametrize("twin", TWINS)``: the pure codec, then the compiled one.
TWINS = twin_params(PURE, NAME)
COMPILED, NOT_BUILT = compiled(NAME)
