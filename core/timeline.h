// Memory timeline: the memory marks, phases and model residencies of a run, with the memory
// counters sampled between them, written in Chrome's trace event format (the JSON that Perfetto,
// ui.perfetto.dev, and chrome://tracing open).
//
// What the file holds:
//   - counter tracks "tensor bytes" (counted CPU tensor memory), "tensor peak bytes" (the highest
//     it went since the previous sample, so a peak between two samples is not lost), "rss bytes"
//     and, with a GPU, "cuda bytes" and "cuda peak bytes" (the caching allocator's, whose peak
//     restarts with each phase);
//   - duration events on one track per lane: "prep" (phases), "train" (steps and their phases,
//     validation, checkpoints), "models" (each heavy model from load to free);
//   - an instant event per memory mark ("encode_vae/after load"), with its numbers as arguments.
//
// Recording is bounded: past max_samples (kMaxSamples) the counter samples are merged pairwise
// (each field's highest, so peaks survive) and the period doubles; past max_spans (kMaxSpans)
// further spans and marks are counted, not kept. This header is torch-free.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace sf::mem {

struct Mark;

// What prep writes into the cache directory and train into OUTPUT_DIR.
constexpr const char* kTimelineFileName = "memory_timeline.json";

// Seconds since the process started, on the clock of the memory marks.
double process_seconds();

class Timeline {
public:
    static constexpr size_t kMaxSamples = 200'000;
    static constexpr size_t kMaxSpans = 100'000;

    // Starts sampling the counters every `period` on a thread of its own (idempotent).
    void start(std::chrono::milliseconds period = std::chrono::milliseconds(20));
    // Stops the sampler; what was recorded stays.
    void stop();
    bool recording() const;
    void clear();

    // A duration event on `lane` from `begin` to `end` (process_seconds()).
    void add_span(const std::string& lane, const std::string& name, double begin, double end);
    // An instant event with the mark's numbers, and a counter sample at its time.
    void add_mark(const Mark& mark);
    // One counter sample now.
    void sample();

    size_t span_count() const;
    size_t sample_count() const;
    // Spans and marks recorded, those counted past the bounds included (counter samples aside).
    size_t event_count() const;

    // The whole recording as a Chrome trace JSON object.
    std::string chrome_trace() const;
    // chrome_trace() into `path` (written to a temporary file, then renamed: never half a file);
    // makes the parent directory. sf::Error kIOError when it cannot.
    void write(const std::string& path) const;

    explicit Timeline(size_t max_samples = kMaxSamples, size_t max_spans = kMaxSpans);
    ~Timeline();
    Timeline(const Timeline&) = delete;
    Timeline& operator=(const Timeline&) = delete;

private:
    struct State;  // <thread> and <mutex> stay out of this header
    std::unique_ptr<State> state_;
};

// The process-wide timeline that marks, phases and resident models write to.
Timeline& timeline();

// A duration event on `lane` from construction to destruction, recorded when the timeline is.
class Span {
public:
    Span(std::string lane, std::string name);
    ~Span();
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

private:
    std::string lane_, name_;
    double begin_;
};

// Records the process-wide timeline for the object's life and writes it to `path` at its end,
// also when the scope is left by an exception (an out-of-memory run is the one worth reading).
// Nested files share one recording: the outermost starts it (clearing what an earlier run
// left) and stops it; each writes what was recorded up to its own end, except one inside a
// file of the same path, whose end leaves the writing to that one. A recording with no span or
// mark (a run refused before it began) writes nothing. Failing to write is logged as a warning,
// never thrown.
class TimelineFile {
public:
    explicit TimelineFile(std::string path);
    ~TimelineFile();
    TimelineFile(const TimelineFile&) = delete;
    TimelineFile& operator=(const TimelineFile&) = delete;

private:
    std::string path_;
    bool written_by_outer_ = false;
};

}  // namespace sf::mem
