// Conversion between at::Tensor and the torch-free record types. The only part of storage/ that
// touches ATen: this header forward-declares at::Tensor, so including it costs nothing; callers
// that hold tensors include ATen themselves.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "storage/tensor_record.h"

namespace at {
class Tensor;
}  // namespace at

namespace sf::storage {

// A copy of the tensor's elements, row-major (moved to the CPU and made contiguous first).
// kInvalidArgument for a dtype the record format does not have (complex, uint16, ...).
TensorData to_tensor_data(const at::Tensor& tensor);

// A new CPU tensor holding a copy of the bytes. kInvalidArgument when the byte count does not
// match the shape.
at::Tensor from_tensor_data(const TensorData& data);

// A CPU tensor over `view`'s bytes without copying (read-only use: the bytes may be a read-only
// mapping); valid while the bytes live. For loading weights: copy it into the parameter.
// kInvalidArgument when the byte count does not match the shape.
at::Tensor wrap_view(const TensorView& view);

// A view of a contiguous CPU tensor's bytes without copying; valid while the tensor lives. Used to
// write checkpoints without a second copy of the weights. kInvalidArgument for a non-contiguous
// or non-CPU tensor.
TensorView view_of(const at::Tensor& tensor);

// Writes named tensors of any device, dtype and layout as one safetensors file, atomically
// (safetensors_file.h); each is copied to a contiguous CPU tensor only for the write.
void write_tensors_file(const std::string& path,
                        const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata);

}  // namespace sf::storage
