#include "core/timeline.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"

namespace sf::mem {

namespace fs = std::filesystem;

namespace {

const auto g_start = std::chrono::steady_clock::now();

struct Sample {
    double t = 0;
    int64_t tensors = 0, tensor_peak = 0, rss = 0, cuda = 0, cuda_peak = 0;
};

Sample sample_now() {
    Sample s;
    s.t = process_seconds();
    s.tensors = cpu_stats().current;
    s.tensor_peak = take_interval_peak();
    s.rss = rss_bytes();
    if (cuda_available()) {
        const Stats cuda = cuda_stats(0);
        s.cuda = cuda.current;
        s.cuda_peak = cuda.peak;
    }
    return s;
}

// Pairs of neighbours become one sample at the first's time holding each field's highest.
void halve(std::vector<Sample>& samples) {
    std::vector<Sample> merged;
    merged.reserve(samples.size() / 2 + 1);
    for (size_t i = 0; i < samples.size(); i += 2) {
        Sample m = samples[i];
        if (i + 1 < samples.size()) {
            const Sample& b = samples[i + 1];
            m.tensors = std::max(m.tensors, b.tensors);
            m.tensor_peak = std::max(m.tensor_peak, b.tensor_peak);
            m.rss = std::max(m.rss, b.rss);
            m.cuda = std::max(m.cuda, b.cuda);
            m.cuda_peak = std::max(m.cuda_peak, b.cuda_peak);
        }
        merged.push_back(m);
    }
    samples = std::move(merged);
}

int64_t micros(double seconds) { return static_cast<int64_t>(seconds * 1e6); }

}  // namespace

double process_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
}

struct Timeline::State {
    struct SpanEvent {
        std::string lane, name;
        double begin, end;
    };
    mutable std::mutex mutex;
    std::condition_variable wake;
    std::thread sampler;
    bool running = false;
    std::chrono::milliseconds period{20};
    std::vector<Sample> samples;
    std::vector<SpanEvent> spans;
    std::vector<Mark> marks;
    int64_t dropped_spans = 0, dropped_marks = 0;
    size_t max_samples, max_spans;

    State(size_t samples_limit, size_t spans_limit)
        : max_samples(std::max<size_t>(samples_limit, 2)), max_spans(spans_limit) {}

    // Called with `mutex` held.
    void add(const Sample& s) {
        samples.push_back(s);
        if (samples.size() >= max_samples) {
            halve(samples);
            period *= 2;
        }
    }
};

Timeline::Timeline(size_t max_samples, size_t max_spans)
    : state_(std::make_unique<State>(max_samples, max_spans)) {}

Timeline::~Timeline() { stop(); }

void Timeline::start(std::chrono::milliseconds period) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->running) return;
    state_->running = true;
    state_->period = std::max(period, std::chrono::milliseconds(1));
    state_->sampler = std::thread([s = state_.get()] {
        std::unique_lock<std::mutex> lock(s->mutex);
        while (s->running) {
            lock.unlock();
            const Sample now = sample_now();  // reads /proc: outside the lock
            lock.lock();
            s->add(now);
            s->wake.wait_for(lock, s->period, [s] { return !s->running; });
        }
    });
}

void Timeline::stop() {
    std::thread sampler;
    {
        std::lock_guard<std::mutex> lock(state_->mutex);
        if (!state_->running) return;
        state_->running = false;
        sampler = std::move(state_->sampler);
    }
    state_->wake.notify_all();
    sampler.join();
    sample();  // the last numbers, so the counters end where the run did
}

bool Timeline::recording() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->running;
}

void Timeline::clear() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->samples.clear();
    state_->spans.clear();
    state_->marks.clear();
    state_->dropped_spans = state_->dropped_marks = 0;
}

void Timeline::add_span(const std::string& lane, const std::string& name, double begin,
                        double end) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->spans.size() >= state_->max_spans) {
        ++state_->dropped_spans;
        return;
    }
    state_->spans.push_back({lane, name, begin, end});
}

void Timeline::add_mark(const Mark& mark) {
    const Sample now = sample_now();
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->marks.size() >= state_->max_spans) {
        ++state_->dropped_marks;
    } else {
        state_->marks.push_back(mark);
    }
    state_->add(now);
}

void Timeline::sample() {
    const Sample now = sample_now();
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->add(now);
}

size_t Timeline::span_count() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->spans.size();
}

size_t Timeline::event_count() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->spans.size() + state_->marks.size() +
           static_cast<size_t>(state_->dropped_spans + state_->dropped_marks);
}

size_t Timeline::sample_count() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->samples.size();
}

std::string Timeline::chrome_trace() const {
    using nlohmann::json;
    std::lock_guard<std::mutex> lock(state_->mutex);
    constexpr int kPid = 1;
    json events = json::array();
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", kPid},
                      {"args", {{"name", fmt::format("sanaflow (pid {})", ::getpid())}}}});
    // One track per lane, in a fixed order first.
    std::map<std::string, int> tids = {{"prep", 1}, {"train", 2}, {"models", 3}};
    for (const auto& span : state_->spans)
        tids.emplace(span.lane, static_cast<int>(tids.size()) + 1);
    for (const auto& [lane, tid] : tids) {
        events.push_back({{"name", "thread_name"},
                          {"ph", "M"},
                          {"pid", kPid},
                          {"tid", tid},
                          {"args", {{"name", lane}}}});
        events.push_back({{"name", "thread_sort_index"},
                          {"ph", "M"},
                          {"pid", kPid},
                          {"tid", tid},
                          {"args", {{"sort_index", tid}}}});
    }
    const bool cuda = std::any_of(state_->samples.begin(), state_->samples.end(),
                                  [](const Sample& s) { return s.cuda_peak > 0; });
    for (const Sample& s : state_->samples) {
        auto counter = [&](const char* name, int64_t bytes) {
            events.push_back({{"name", name},
                              {"ph", "C"},
                              {"ts", micros(s.t)},
                              {"pid", kPid},
                              {"args", {{"bytes", bytes}}}});
        };
        counter("tensor bytes", s.tensors);
        counter("tensor peak bytes", s.tensor_peak);
        counter("rss bytes", s.rss);
        if (cuda) {
            counter("cuda bytes", s.cuda);
            counter("cuda peak bytes", s.cuda_peak);
        }
    }
    for (const auto& span : state_->spans) {
        events.push_back({{"name", span.name},
                          {"cat", span.lane},
                          {"ph", "X"},
                          {"ts", micros(span.begin)},
                          {"dur", std::max<int64_t>(micros(span.end) - micros(span.begin), 1)},
                          {"pid", kPid},
                          {"tid", tids.at(span.lane)}});
    }
    for (const Mark& m : state_->marks) {
        events.push_back({{"name", m.stage + "/" + m.point},
                          {"cat", "mark"},
                          {"ph", "i"},
                          {"s", "p"},
                          {"ts", micros(m.seconds)},
                          {"pid", kPid},
                          {"tid", 0},
                          {"args",
                           {{"tensor_bytes", m.cpu.current},
                            {"tensor_peak_bytes", m.cpu.peak},
                            {"cuda_bytes", m.cuda.current},
                            {"cuda_peak_bytes", m.cuda.peak},
                            {"rss_bytes", m.rss},
                            {"peak_rss_bytes", m.peak_rss}}}});
    }
    json out = {{"traceEvents", std::move(events)},
                {"displayTimeUnit", "ms"},
                {"otherData",
                 {{"producer", "sanaflow"},
                  {"dropped_spans", state_->dropped_spans},
                  {"dropped_marks", state_->dropped_marks}}}};
    return out.dump();
}

void Timeline::write(const std::string& path) const {
    const std::string text = chrome_trace();
    const fs::path target(path);
    std::error_code ec;
    if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
    const fs::path tmp = target.string() + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << text;
        out.flush();
        if (!out) throw Error::IOError(fmt::format("cannot write the memory timeline {}", path));
    }
    fs::rename(tmp, target, ec);
    if (ec) {
        throw Error::IOError(
            fmt::format("cannot write the memory timeline {}: {}", path, ec.message()));
    }
}

Timeline& timeline() {
    static Timeline t;
    return t;
}

Span::Span(std::string lane, std::string name)
    : lane_(std::move(lane)), name_(std::move(name)), begin_(process_seconds()) {}

Span::~Span() {
    if (timeline().recording()) timeline().add_span(lane_, name_, begin_, process_seconds());
}

namespace {
std::mutex g_files_mutex;
std::vector<std::string> g_open_paths;  // of the files alive now, outermost first
}  // namespace

TimelineFile::TimelineFile(std::string path) : path_(std::move(path)) {
    std::lock_guard<std::mutex> lock(g_files_mutex);
    written_by_outer_ =
        std::find(g_open_paths.begin(), g_open_paths.end(), path_) != g_open_paths.end();
    g_open_paths.push_back(path_);
    if (g_open_paths.size() == 1) {
        timeline().clear();
        timeline().start();
    }
}

TimelineFile::~TimelineFile() {
    std::lock_guard<std::mutex> lock(g_files_mutex);
    g_open_paths.erase(std::find(g_open_paths.rbegin(), g_open_paths.rend(), path_).base() - 1);
    if (g_open_paths.empty()) timeline().stop();
    if (written_by_outer_ || timeline().event_count() == 0) return;
    try {
        timeline().write(path_);
        log_info("memory timeline: {} (open it in ui.perfetto.dev)", path_);
    } catch (const std::exception& e) {
        log_warn("memory timeline not written: {}", e.what());
    }
}

}  // namespace sf::mem
