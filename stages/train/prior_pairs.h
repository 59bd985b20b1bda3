// Prior preservation (DreamBooth's --with_prior_preservation): every batch of instance samples
// comes with as many class samples (images the base model generated for --class_prompt), and the
// loss is the instance loss plus --prior_loss_weight times the class samples' loss, as diffusers'
// train_dreambooth_lora_sana.py computes it in one forward pass over the joined batch.
//
// Upstream's DreamBoothDataset has max(instances, class images) items, item i pairing instance
// i mod n with class image i mod m. Here the pairing is made per aspect bucket (a batch is one
// bucket's shape), which is upstream's when every image is in one bucket (--center_crop); the
// sampler then draws batches of pairs, so an epoch is as long as upstream's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "stages/train/train_data.h"

namespace sf::train {

struct PriorPairs {
    // (instance sample, class sample): indices into the instance and the class TrainingSet.
    std::vector<std::pair<int64_t, int64_t>> pairs;
    // bucket -> indices into `pairs`: what the BucketSampler draws from.
    std::map<Bucket, std::vector<int64_t>> buckets;
};

// Pairs each bucket's instance samples (`instances`, already repeated by --repeats) with the
// same bucket's class samples: max(n, m) pairs, pair j = (instance j mod n, class j mod m).
// `class_limit` > 0 keeps the first that many class samples of `classes` (in index order, as
// upstream keeps the first --num_class_images files). kInvalidArgument naming the buckets that
// have instance samples but no class sample.
PriorPairs pair_with_class_samples(const std::map<Bucket, std::vector<int64_t>>& instances,
                                   const std::map<Bucket, std::vector<int64_t>>& classes,
                                   int64_t class_limit);

// The instance batch followed by the class batch, as one batch: captions zero-padded to the
// longer of the two, `indices` the instance batch's. `sample_weights` [n + m] (fp32) makes the
// mean loss over the joined batch the instance loss plus `prior_loss_weight` times the class
// loss: (n + m) / n for an instance sample, prior_loss_weight (n + m) / m for a class sample.
struct PriorBatch {
    TrainingBatch batch;
    at::Tensor sample_weights;
};
PriorBatch join_prior_batch(const TrainingBatch& instances, const TrainingBatch& classes,
                            double prior_loss_weight);

}  // namespace sf::train
