// encode_text: captions -> Gemma-2 features, as cache records.
//
// Sana's prompt handling: the complex human instruction is prepended, the sequence padded right,
// and the first token plus the last max_length - 1 kept. Only the unpadded tokens are stored
// (the valid tokens are a prefix of the kept sequence), with their count: a 2304-wide feature
// row per token is most of a cache's bytes. Identical captions share one record: the key is a
// hash of the caption and this stage's fingerprint.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "stages/encode/model_source.h"
#include "storage/fingerprint.h"
#include "storage/tensor_record.h"

namespace sf::stages {

struct EncodeTextConfig {
    ModelSource model{"", "gemma-2-tiny", 0};
    std::string device = "auto";
    std::string mixed_precision = "no";
    int batch_size = 8;
    int max_length = 300;
    // Prepended to every caption, one entry per line, as diffusers' encode_prompt takes it; empty:
    // none (the default of diffusers' train_dreambooth_lora_sana.py).
    // model::sana_complex_human_instruction() is Sana's own.
    std::vector<std::string> complex_human_instruction;
    // Keep the encoder's weights in host memory and move one layer at a time to the device
    // (prep --offload): for a device smaller than the encoder. Same features, slower.
    bool offload = false;
};

class EncodeTextStage {
public:
    explicit EncodeTextStage(EncodeTextConfig config);
    ~EncodeTextStage();

    const EncodeTextConfig& config() const { return config_; }
    const storage::Fingerprint& fingerprint() const { return fingerprint_; }
    // The text record's key for `caption` under this stage.
    std::string key(const std::string& caption) const;

    class Session {
    public:
        virtual ~Session() = default;
        // One [tokens, hidden] tensor per caption: the valid prefix of the kept sequence, in the
        // stage's dtype, on the CPU.
        virtual std::vector<at::Tensor> encode(const std::vector<std::string>& captions) = 0;
        // The empty prompt as Sana's negative prompt: [tokens, hidden], valid prefix only.
        virtual at::Tensor encode_empty() = 0;
    };
    std::unique_ptr<Session> open() const;

    storage::Record record(const at::Tensor& features, const std::string& caption) const;

private:
    EncodeTextConfig config_;
    storage::Fingerprint fingerprint_;
    std::string fingerprint_hash_;
};

}  // namespace sf::stages
