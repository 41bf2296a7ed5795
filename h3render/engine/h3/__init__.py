"""antirez's h3.c (MiniMax-H3 on Metal) as an h3render engine.

options   h3.c's options and limits, validated at enqueue
inspect   `models inspect`: an H3 snapshot's safetensors headers, without loading
estimate  the memory an h3.c job needs, for admission

The C side is csrc/h3bridge/h3bridge.c (built by cmake/h3bridge.cmake); see
docs/H3C.md.
"""

from h3render.engine.h3.options import H3OptionsError, H3Request, validate_h3_options

__all__ = ["H3OptionsError", "H3Request", "validate_h3_options"]
