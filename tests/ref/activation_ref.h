// Double-precision scalar references of the element-wise activations. Used only by tests.
#pragma once

#include <cmath>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;

inline double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
inline double silu(double x) {
  return x * sigmoid(x);
}
inline double softplus(double x) {
  return x > 20.0 ? x : std::log1p(std::exp(x));
}

inline DVec silu(const DVec& x) {
  DVec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = silu(x[i]);
  return y;
}

inline DVec swiglu(const DVec& gate, const DVec& up) {
  DVec y(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) y[i] = silu(gate[i]) * up[i];
  return y;
}

inline DVec sigmoid_gate(const DVec& x, const DVec& g) {
  DVec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * sigmoid(g[i]);
  return y;
}

}  // namespace mt::ref
