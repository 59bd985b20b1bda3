#include "stages/encode/resident_model.h"

#include <map>
#include <mutex>

#include "core/memory.h"
#include "core/timeline.h"

namespace sf::stages {

namespace {
// When each resident model's load began, for its span on the timeline's "models" lane.
std::mutex g_loads_mutex;
std::map<std::string, double> g_load_begins;
}  // namespace

void resident_model_before_load(const std::string& stage) {
    {
        std::lock_guard<std::mutex> lock(g_loads_mutex);
        g_load_begins[stage] = mem::process_seconds();
    }
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
    std::lock_guard<std::mutex> lock(g_loads_mutex);
    const auto begin = g_load_begins.find(stage);
    if (begin == g_load_begins.end()) return;
    if (mem::timeline().recording()) {
        mem::timeline().add_span("models", stage, begin->second, mem::process_seconds());
    }
    g_load_begins.erase(begin);
}

}  // namespace sf::stages
