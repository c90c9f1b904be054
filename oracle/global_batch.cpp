// Assembling global batches from packed windows.
#include "oracle/global_batch.h"

namespace touchstone {

MicroBatch GlobalBatch::micro_batch(int64_t first, int64_t count) const {
  const size_t offset = static_cast<size_t>(first * seq);
  return MicroBatch{count,
                    tokens.data() + offset,
                    targets.data() + offset,
                    position_ids.data() + offset,
                    document_ids.data() + offset,
                    sample_indices.empty() ? nullptr : sample_indices.data() + first};
}

ContextMicroBatch GlobalBatch::context_micro_batch(int64_t first, int64_t count,
                                                   const LoadBalancedSplit& split, int rank) const {
  const MicroBatch whole = micro_batch(first, count);
  ContextMicroBatch c;
  c.tokens = split.take(whole.tokens, rank, count);
  c.targets = split.take(whole.targets, rank, count);
  c.position_ids = split.take(whole.position_ids, rank, count);
  c.document_ids = split.take(whole.document_ids, rank, count);
  c.window_positions = split.positions(rank, count);
  c.batch = MicroBatch{count,
                       c.tokens.data(),
                       c.targets.data(),
                       c.position_ids.data(),
                       c.document_ids.data(),
                       whole.sample_indices,
                       c.window_positions.data(),
                       whole.document_ids};
  return c;
}

int64_t GlobalBatch::loss_tokens(int64_t first, int64_t count) const {
  int64_t n = 0;
  for (int64_t i = first * seq; i < (first + count) * seq; ++i)
    n += targets[static_cast<size_t>(i)] != data::kIgnoreTarget;
  return n;
}

GlobalBatch make_global_batch(const std::vector<data::Window>& windows, int64_t global_batch_size,
                              int64_t step) {
  GlobalBatch batch;
  batch.windows = global_batch_size;
  batch.seq = static_cast<int64_t>(windows.front().tokens.size());
  const auto num_windows = static_cast<int64_t>(windows.size());
  for (int64_t row = 0; row < global_batch_size; ++row) {
    const int64_t sample = (step - 1) * global_batch_size + row;
    const data::Window& w = windows[static_cast<size_t>(sample % num_windows)];
    batch.sample_indices.push_back(sample);
    batch.tokens.insert(batch.tokens.end(), w.tokens.begin(), w.tokens.end());
    batch.targets.insert(batch.targets.end(), w.targets.begin(), w.targets.end());
    batch.position_ids.insert(batch.position_ids.end(), w.position_ids.begin(), w.position_ids.end());
    batch.document_ids.insert(batch.document_ids.end(), w.document_ids.begin(), w.document_ids.end());
  }
  return batch;
}

}  // namespace touchstone
