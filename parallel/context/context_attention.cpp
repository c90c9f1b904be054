// Ring and all-gather attention over a context-parallel group (context_attention.h).
#include "parallel/context/context_attention.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "parallel/comm/message_tags.h"

namespace touchstone {

namespace {

// One transfer as the observer sees it: begins here, ends with the scope.
class ObservedTransfer {
 public:
  explicit ObservedTransfer(ContextTransferObserver* observer) : observer_(observer) {
    if (observer_ != nullptr) observer_->transfer_begins();
  }
  ~ObservedTransfer() {
    if (observer_ != nullptr) observer_->transfer_ends();
  }
  ObservedTransfer(const ObservedTransfer&) = delete;
  ObservedTransfer& operator=(const ObservedTransfer&) = delete;

 private:
  ContextTransferObserver* observer_;
};

// The rows of one rank in every window, as an attention block sees them.
struct Rows {
  std::vector<int32_t> positions, documents;  // [b * rows]
};

Rows rows_of(const LoadBalancedSplit& split, int rank, const int32_t* window_document_ids, int64_t windows) {
  return Rows{split.positions(rank, windows), split.take(window_document_ids, rank, windows)};
}

// The rows of every rank, rank by rank within each window: the keys an all-gather assembles.
Rows all_rows(const LoadBalancedSplit& split, const int32_t* window_document_ids, int64_t windows) {
  Rows all;
  for (int64_t w = 0; w < windows; ++w) {
    for (int rank = 0; rank < split.cp(); ++rank) {
      const Rows one = rows_of(split, rank, window_document_ids + w * split.seq(), 1);
      all.positions.insert(all.positions.end(), one.positions.begin(), one.positions.end());
      all.documents.insert(all.documents.end(), one.documents.begin(), one.documents.end());
    }
  }
  return all;
}

// The caller's site with what one transfer carries: "<layer site> ring step 1: K/V of cp rank 0 ...".
std::string step_site(const std::string& site, const std::string& what) {
  return site.empty() ? what : site + " " + what;
}

AttentionBlock block_of(const Rows& queries, const Rows& keys, int64_t key_seq, int64_t window_seq) {
  return AttentionBlock{key_seq,
                        window_seq,
                        queries.positions.data(),
                        queries.documents.data(),
                        keys.positions.data(),
                        keys.documents.data()};
}

// The all-gather's layout and the block's: gathered[cp][2][b,NKV,Tl,D] (each rank's k then v) <->
// k_all, v_all [b,NKV,cp*Tl,D] (rank s's rows at s*Tl in every window and head). to_blocks = false
// reads gathered into k_all/v_all; true writes k_all/v_all into gathered.
void rearrange(double* gathered, double* k_all, double* v_all, const AttentionShape& local, int cp,
               bool to_blocks) {
  const int64_t Tl = local.seq, D = local.head_dim, slices = local.windows * local.num_kv_heads;
  const int64_t n_kv = slices * Tl * D;
  for (int s = 0; s < cp; ++s) {
    for (int half = 0; half < 2; ++half) {
      double* block = gathered + (2 * s + half) * n_kv;
      double* all = half == 0 ? k_all : v_all;
      for (int64_t slice = 0; slice < slices; ++slice) {
        double* rows = all + (slice * cp + s) * Tl * D;
        if (to_blocks) {
          std::copy_n(rows, Tl * D, block + slice * Tl * D);
        } else {
          std::copy_n(block + slice * Tl * D, Tl * D, rows);
        }
      }
    }
  }
}

}  // namespace

void ContextParallelAttention::forward(const double* q, const double* k, const double* v,
                                       const int32_t* window_document_ids, bool document_masking,
                                       const AttentionDropout& dropout, const AttentionShape& local,
                                       double* out, double* lse) const {
  const int cp = cp_.size(), rank = cp_.rank();
  const LoadBalancedSplit split(local.seq * cp, cp);
  const int64_t b = local.windows, Tl = local.seq, T = split.seq(), D = local.head_dim;
  const int64_t n_kv = b * local.num_kv_heads * Tl * D;
  const Shape kv_shape{2, b, local.num_kv_heads, Tl, D};
  const Rows queries = rows_of(split, rank, window_document_ids, b);

  if (comm_ == CpComm::kAllGather) {
    std::vector<double> kv(static_cast<size_t>(2 * n_kv)), gathered(static_cast<size_t>(2 * n_kv * cp));
    std::copy_n(k, n_kv, kv.data());
    std::copy_n(v, n_kv, kv.data() + n_kv);
    {
      const TransferSite named(cp_, step_site(cp_.site(), "all-gather of K and V"));
      const ObservedTransfer observed(observer_);
      cp_.all_gather(kv.data(), gathered.data(), 2 * n_kv, kv_shape);
    }
    std::vector<double> k_all(static_cast<size_t>(n_kv * cp)), v_all(k_all.size());
    rearrange(gathered.data(), k_all.data(), v_all.data(), local, cp, false);
    const Rows keys = all_rows(split, window_document_ids, b);
    backend_.attention_block_forward(q, k_all.data(), v_all.data(), block_of(queries, keys, T, T),
                                     document_masking, dropout, local, out, lse);
    return;
  }

  // Ring: the block of rank - s at step s, passed on to rank + 1 while it is used.
  const int64_t n_out = b * Tl * local.num_heads * D, n_lse = b * local.num_heads * Tl;
  std::fill(out, out + n_out, 0.0);
  std::fill(lse, lse + n_lse, -std::numeric_limits<double>::infinity());
  std::vector<double> kv(static_cast<size_t>(2 * n_kv)), arriving(cp > 1 ? kv.size() : 0);
  std::copy_n(k, n_kv, kv.data());
  std::copy_n(v, n_kv, kv.data() + n_kv);
  std::vector<double> block_out(static_cast<size_t>(n_out)), block_lse(static_cast<size_t>(n_lse));
  const int next = (rank + 1) % cp, previous = (rank + cp - 1) % cp;
  const std::string site = cp_.site();
  for (int step = 0; step < cp; ++step) {
    const bool more = step + 1 < cp;
    const int source = (rank + cp - step) % cp;  // whose K/V this step computes with
    const std::string ring = "ring step " + std::to_string(step) + ": ";
    if (more) {
      const TransferSite named(
          cp_, step_site(site, ring + "passing on the K/V of cp rank " + std::to_string(source)));
      cp_.send(kv.data(), 2 * n_kv, next, message_tags::kContextKeysValues, kv_shape);
    }
    const Rows keys = rows_of(split, source, window_document_ids, b);
    const AttentionTileCount before = backend_.attention_tiles();
    backend_.attention_block_forward(q, kv.data(), kv.data() + n_kv, block_of(queries, keys, Tl, T),
                                     document_masking, dropout, local, block_out.data(), block_lse.data());
    const AttentionTileCount after = backend_.attention_tiles();
    backend_.attention_merge(block_out.data(), block_lse.data(), local, out, lse);
    if (more) {
      // The receive names the block just computed and how much of it masking skipped.
      const TransferSite named(
          cp_, step_site(site, ring + "computed with the K/V of cp rank " + std::to_string(source) + " (" +
                                   std::to_string(after.skipped - before.skipped) + " of " +
                                   std::to_string(after.skipped - before.skipped + after.computed -
                                                  before.computed) +
                                   " tile pairs skipped); receiving the K/V of cp rank " +
                                   std::to_string((source + cp - 1) % cp)));
      const ObservedTransfer observed(observer_);
      cp_.recv(arriving.data(), 2 * n_kv, previous, message_tags::kContextKeysValues, kv_shape);
      kv.swap(arriving);
    }
  }
  const ObservedTransfer observed(observer_);
  cp_.wait_sends();
}

void ContextParallelAttention::backward(const double* dout, const double* q, const double* k, const double* v,
                                        const double* out, const double* lse,
                                        const int32_t* window_document_ids, bool document_masking,
                                        const AttentionDropout& dropout, const AttentionShape& local,
                                        double* dq, double* dk, double* dv) const {
  const int cp = cp_.size(), rank = cp_.rank();
  const LoadBalancedSplit split(local.seq * cp, cp);
  const int64_t b = local.windows, Tl = local.seq, T = split.seq(), D = local.head_dim;
  const int64_t n_kv = b * local.num_kv_heads * Tl * D, n_q = b * local.num_heads * Tl * D;
  const Shape kv_shape{2, b, local.num_kv_heads, Tl, D};
  const Rows queries = rows_of(split, rank, window_document_ids, b);
  std::vector<double> kv(static_cast<size_t>(2 * n_kv));
  std::copy_n(k, n_kv, kv.data());
  std::copy_n(v, n_kv, kv.data() + n_kv);

  if (comm_ == CpComm::kAllGather) {
    // Gather K and V again (nothing was kept from the forward), then every key's gradient from these
    // queries, summed over the ranks into each rank's own rows by the reduce-scatter.
    std::vector<double> gathered(static_cast<size_t>(2 * n_kv * cp));
    const std::string site = cp_.site();
    {
      const TransferSite named(cp_, step_site(site, "all-gather of K and V again"));
      const ObservedTransfer observed(observer_);
      cp_.all_gather(kv.data(), gathered.data(), 2 * n_kv, kv_shape);
    }
    std::vector<double> k_all(static_cast<size_t>(n_kv * cp)), v_all(k_all.size());
    rearrange(gathered.data(), k_all.data(), v_all.data(), local, cp, false);
    const Rows keys = all_rows(split, window_document_ids, b);
    std::vector<double> dk_all(k_all.size()), dv_all(v_all.size());
    backend_.attention_block_backward(dout, q, k_all.data(), v_all.data(), out, lse,
                                      block_of(queries, keys, T, T), document_masking, dropout, local, dq,
                                      dk_all.data(), dv_all.data());
    rearrange(gathered.data(), dk_all.data(), dv_all.data(), local, cp, true);
    {
      const TransferSite named(cp_, step_site(site, "reduce-scatter of dK and dV to their ranks"));
      const ObservedTransfer observed(observer_);
      cp_.reduce_scatter_sum(gathered.data(), kv.data(), 2 * n_kv, kv_shape);
    }
    backend_.round(TensorRole::kActivation, kv.data(), 2 * n_kv);  // a BF16 sum in BF16 mode
    std::copy_n(kv.data(), n_kv, dk);
    std::copy_n(kv.data() + n_kv, n_kv, dv);
    return;
  }

  // Ring: the K/V blocks go round again, each with the dK/dV accumulator of its owner's rows.
  std::vector<double> dkv(kv.size(), 0.0), arriving(cp > 1 ? kv.size() : 0);
  std::vector<double> block_dq(static_cast<size_t>(n_q)), block_dkv(kv.size());
  std::fill(dq, dq + n_q, 0.0);
  const int next = (rank + 1) % cp, previous = (rank + cp - 1) % cp;
  const std::string site = cp_.site();
  for (int step = 0; step < cp; ++step) {
    const bool more = step + 1 < cp;
    const int source = (rank + cp - step) % cp;
    const TransferSite named(cp_,
                             step_site(site, "ring step " + std::to_string(step) + ": the K/V of cp rank " +
                                                 std::to_string(source) + " and its dK/dV accumulator"));
    if (more) cp_.send(kv.data(), 2 * n_kv, next, message_tags::kContextKeysValues, kv_shape);
    const Rows keys = rows_of(split, source, window_document_ids, b);
    backend_.attention_block_backward(dout, q, kv.data(), kv.data() + n_kv, out, lse,
                                      block_of(queries, keys, Tl, T), document_masking, dropout, local,
                                      block_dq.data(), block_dkv.data(), block_dkv.data() + n_kv);
    backend_.add_inplace(dq, block_dq.data(), n_q);
    backend_.add_inplace(dkv.data(), block_dkv.data(), 2 * n_kv);
    if (cp > 1) {
      // The accumulator moves on with its block; after the last step it reaches the block's owner.
      cp_.send(dkv.data(), 2 * n_kv, next, message_tags::kContextKeyValueGradients, kv_shape);
      const ObservedTransfer observed(observer_);
      if (more) {
        cp_.recv(arriving.data(), 2 * n_kv, previous, message_tags::kContextKeysValues, kv_shape);
        kv.swap(arriving);
      }
      cp_.recv(dkv.data(), 2 * n_kv, previous, message_tags::kContextKeyValueGradients, kv_shape);
    }
  }
  {
    const ObservedTransfer observed(observer_);
    cp_.wait_sends();
  }
  std::copy_n(dkv.data(), n_kv, dk);
  std::copy_n(dkv.data() + n_kv, n_kv, dv);
}

}  // namespace touchstone
