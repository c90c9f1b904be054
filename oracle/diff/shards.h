// Per-rank shards -> full tensors (candidate format "shards"; docs/diffing.md describes it).
//
// A directory holds shards.json:
//   {"format": "touchstone-shards", "format_version": 1, "tp": 2, "pp": 2, "cp": 1,
//    "stage_layers": [1, 2],              optional; default: num_layers / pp each
//    "tie_embeddings": false,             optional; default: the golden config's model.tie_embeddings
//    "tied_embedding_grads": "partial"}   optional; "partial" (each stage's own part, summed here) or
//                                         "summed" (both copies already hold the sum, as in Megatron-LM's
//                                         dumps, which are written after the embedding all-reduce)
// and one HDF5 file per rank, rank_tp{t}_pp{p}.h5, with datasets at golden-schema paths
// (steps/<s>/grads/<name>, steps/<s>/params/<name>, params/init/<name>, steps/<s>/loss, ...) where each
// tensor is that rank's shard in Megatron-LM's layout and layer numbers are local to the stage. With
// tied embeddings and pp > 1 the last stage's copy is named output_layer.weight (Megatron-LM's name).
// Scalars are taken from the last stage's tp rank 0 when it has them, else from the first rank that does.
//
// With "cp": c (optional, default 1) the files are rank_tp{t}_cp{c}_pp{p}.h5 and every cp rank holds the
// same shards: cp rank 0's are compared, every other cp rank's copy is checked against them bit for bit
// (a difference goes to Candidate::replica_disagreements), scalars come from cp rank 0, and token_losses
// of each cp rank's rows ([B, T/c], LoadBalancedSplit's order) are put back at their positions.
//
// Shards go back into place with parallel/tensor/sharding.h (place_shard), the one home of the layout
// rules, and stages are cut with Config::stage_boundaries().
#pragma once

#include <string>

#include "oracle/diff/candidate.h"

namespace touchstone::diff {

Candidate load_shards(const std::string& directory, const GoldenReader& golden);

}  // namespace touchstone::diff
