// A heavy model on the device for one phase only. The model is built and loaded inside the
// object's constructor and dropped in its destructor, which also empties the CUDA caching
// allocator; memory is marked before load, after load, at the phase's peak and after free, so the
// per-stage memory table shows where the memory went. The pipeline holds the device lease around
// the object's whole life, so two model phases never share the device.
#pragma once

#include <functional>
#include <string>
#include <utility>

namespace sf::stages {

// The marks, outside the template so that this header needs no torch.
void resident_model_before_load(const std::string& stage);
void resident_model_after_load(const std::string& stage);
void resident_model_before_free(const std::string& stage);
void resident_model_after_free(const std::string& stage);

template <typename Model>
class ResidentModel {
public:
    ResidentModel(std::string stage, const std::function<Model()>& load)
        : stage_(std::move(stage)) {
        resident_model_before_load(stage_);
        model_ = load();
        resident_model_after_load(stage_);
    }
    ~ResidentModel() {
        resident_model_before_free(stage_);
        model_ = Model(nullptr);  // the last reference: weights are freed here
        resident_model_after_free(stage_);
    }
    ResidentModel(const ResidentModel&) = delete;
    ResidentModel& operator=(const ResidentModel&) = delete;

    Model& operator*() { return model_; }
    Model& get() { return model_; }
    const std::string& stage() const { return stage_; }

private:
    std::string stage_;
    Model model_{nullptr};
};

}  // namespace sf::stages
