#include "stages/encode/resident_model.h"

#include "core/memory.h"

namespace sf::stages {

void resident_model_before_load(const std::string& stage) {
    mem::reset_peak();
    mem::memory_log().mark(stage, "before load");
}

void resident_model_after_load(const std::string& stage) {
    mem::memory_log().mark(stage, "after load");
}

void resident_model_before_free(const std::string& stage) { mem::memory_log().mark(stage, "peak"); }

void resident_model_after_free(const std::string& stage) {
    mem::release_memory(stage + " after free");
    mem::memory_log().mark(stage, "after free");
}

}  // namespace sf::stages
