// Double-precision reference of the depthwise causal conv1d over packed documents.
#pragma once

#include <cstdint>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;

// x [tokens, channels], w [channels, kernel] (last tap = current token), documents given by
// their cumulative offsets. Each document is convolved on its own, left-padded with zeros.
inline DVec causal_conv1d(const DVec& x, const DVec& w, const std::vector<int64_t>& offsets,
                          int64_t channels, int64_t kernel) {
  DVec y(x.size(), 0.0);
  for (size_t doc = 0; doc + 1 < offsets.size(); ++doc) {
    const int64_t begin = offsets[doc], len = offsets[doc + 1] - begin;
    for (int64_t i = 0; i < len; ++i)
      for (int64_t c = 0; c < channels; ++c) {
        double s = 0;
        for (int64_t lag = 0; lag < kernel; ++lag) {  // lag 0 is the current token
          if (i - lag < 0) break;
          s += w[c * kernel + (kernel - 1 - lag)] * x[(begin + i - lag) * channels + c];
        }
        y[(begin + i) * channels + c] = s;
      }
  }
  return y;
}

}  // namespace mt::ref
