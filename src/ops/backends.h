// The backends' declarations of an op family's bodies, written once: every entry has a body of
// its own function type in ops/cpu/ and in ops/cuda/ (docs/contributing.md, "An op"), so one list
// declares both.
#pragma once

// MT_OP_BACKENDS(XForward X_forward; XBackward X_backward;) declares cpu::X_forward,
// cuda::X_forward, cpu::X_backward and cuda::X_backward in the enclosing namespace (mt::ops).
#define MT_OP_BACKENDS(...) \
  namespace cpu {           \
  __VA_ARGS__               \
  }                         \
  namespace cuda {          \
  __VA_ARGS__               \
  }
