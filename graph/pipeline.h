// A linear pipeline over tbb::flow, declared as
//
//     source -> stage -> stage -> ... -> sink
//
// where each stage runs in parallel (CPU work, with a concurrency limit), serially (a device
// model) or serially over batches. Memory is bounded by a token pool fixed when the pipeline is
// built: the source produces an item only when it holds a free token, the item carries that
// token through every stage, and the sink (or the rejection of the item) returns it. So at most
// `max_in_flight` items exist at once, whatever the speed of each stage; the plan, with the bound,
// is printed when the run starts.
//
// One stage may expand each item into many (a clip into its windows of frames). Its outputs take
// tokens of a second pool of `max_in_flight` tokens, one each, as it emits them: so at most
// `max_in_flight` source items exist before it and at most `max_in_flight` outputs after it,
// whatever the number of outputs per item.
//
// Failure: a stage that throws sf::Reject drops that item only; it is reported through
// on_reject(), counted and its token returned, and the run goes on. Any other exception is fatal:
// the run is cancelled (the source stops, queued items are dropped, stage code may poll
// cancel_token()), the graph drains, and run() rethrows the first exception with its type intact.
// Items the sink accepted before the failure stay accepted.
//
// This header includes no TBB: stage and pipeline code never sees flow_graph.h. Items are
// type-erased as std::any (copyable payloads: structs of tensors and strings), and moved, never
// copied, from stage to stage.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "graph/cancel.h"
#include "graph/progress.h"

namespace sf::graph {

// What a stage body can learn about the item it is working on, via current_item().
struct ItemContext {
    int64_t index = -1;      // position in source order, from 0
    std::string_view label;  // from describe(), e.g. the file path; may be empty
    const CancelToken* cancel = nullptr;
    // Position among the outputs of its source item, from 0, after an expand stage (and, in the
    // expand stage's next function, of the output being made); -1 for the source item itself.
    int64_t sub = -1;
};

// The item the calling thread's stage body is processing; nullptr outside a stage body.
const ItemContext* current_item();

struct RejectInfo {
    std::string stage;   // the stage that threw sf::Reject
    int64_t index = -1;  // source order
    std::string label;   // describe() of the source item, empty without describe()
    std::string reason;
    int64_t sub = -1;  // which output of the expand stage; -1 for the source item itself
};

// The order in which a sink takes items, or in which a batched stage groups them.
enum class ItemOrder {
    kArrival,  // as items finish: no waiting, no buffering
    // In source order: finished items wait (holding their tokens) for earlier ones. After an
    // expand stage, the order is (source index, sub index): an item's outputs in the order they
    // were made, before the next item's.
    kSource,
};
using SinkOrder = ItemOrder;

struct StageStats {
    std::string name;
    // Bodies that returned normally; for an expand stage, inputs expanded to their end.
    int64_t items = 0;
    // Bodies that threw sf::Reject (for a batch: items in the batch; for an expand stage: inputs).
    int64_t rejects = 0;
    double busy_seconds = 0;  // summed over concurrent bodies, so it may exceed wall time
};

// Every item ends once, as completed, rejected, dropped or (a source item at the expand stage)
// expanded, so produced + outputs == expanded + completed + rejected + dropped.
struct RunStats {
    int64_t produced = 0;   // items the source emitted (including ones it rejected itself)
    int64_t outputs = 0;    // items the expand stage emitted
    int64_t expanded = 0;   // source items whose expansion ran to its end
    int64_t completed = 0;  // items the sink accepted
    int64_t rejected = 0;   // source items and outputs, each reported once through on_reject()
    int64_t dropped = 0;    // items thrown away because the run was cancelled
    double seconds = 0;
    int tokens = 0;  // the bound (of each pool, with an expand stage)
    // The most items that held a token at once: outputs of the expand stage when there is one
    // (the heavy items), source items otherwise. Never above `tokens`.
    int max_in_flight_observed = 0;
    int max_inputs_in_flight_observed = 0;  // source items alone; never above `tokens`
    bool cancelled = false;                 // by a fatal error or by cancel()
    std::vector<StageStats> stages;         // source, stages..., sink
};

class LinearPipeline {
public:
    using SourceFn = std::function<bool(std::any& out)>;
    using StageFn = std::function<std::any(std::any&&)>;
    using BatchFn = std::function<std::vector<std::any>(std::vector<std::any>&&)>;
    using SinkFn = std::function<void(std::any&&)>;
    // Opens the expansion of one item; the returned function fills `out` with the next output and
    // returns true, or returns false when the item has no more outputs.
    using ExpandFn = std::function<SourceFn(std::any&& in)>;
    using DescribeFn = std::function<std::string(const std::any& source_item)>;
    using RejectFn = std::function<void(const RejectInfo&)>;

    // `max_in_flight`: the token count, >= 1.
    LinearPipeline(std::string name, int max_in_flight);
    ~LinearPipeline();
    LinearPipeline(const LinearPipeline&) = delete;
    LinearPipeline& operator=(const LinearPipeline&) = delete;

    // Called serially; fills `out` and returns true, or returns false when exhausted (it is not
    // called again after that). `total`: the expected count for progress, -1 when unknown. May
    // throw sf::Reject for an item it cannot produce (the index is used up and reported).
    LinearPipeline& source(std::string name, SourceFn fn, int64_t total = -1);
    // A label for each source item, kept with the item so that a rejection can name it.
    LinearPipeline& describe(DescribeFn fn);
    // A stage running up to `concurrency` items at once.
    LinearPipeline& parallel(std::string name, int concurrency, StageFn fn);
    // A stage running one item at a time (a device model stage; it may hold the DeviceLease).
    LinearPipeline& serial(std::string name, StageFn fn);
    // A serial stage over batches of up to `batch_size` items; fn returns one output per input,
    // in order. A partial batch runs when no more items can come (end of input, or every token
    // waiting). sf::Reject from fn rejects the whole batch. Needs batch_size <= max_in_flight.
    // With ItemOrder::kSource, batches are cut from consecutive items in source order (a rejected
    // item leaves a hole), so which items share a batch does not depend on timing: a model whose
    // numerics depend on the batch then gives the same outputs every run. (Unless a second batch
    // stage can hold the tokens this one waits for: every token waiting then cuts a partial batch
    // in each batch stage, wherever timing left them. With one batch stage, every token waits only
    // at the end of input.)
    LinearPipeline& serial_batched(std::string name, int batch_size, BatchFn fn,
                                   ItemOrder order = ItemOrder::kArrival);
    // A serial stage that turns each item into zero or more outputs (a clip into windows of
    // frames), at most one per pipeline. Items are expanded one at a time, in source order; the
    // next function is called only when a token of the second pool is free, so an item's outputs
    // never all exist at once. Outputs keep their item's index and label and number themselves
    // with ItemContext::sub. sf::Reject from fn rejects the item; from the next function, it
    // rejects the item while the outputs it already made go on (a stream that breaks mid-clip
    // keeps the windows before the break). Any other exception is fatal; the open expansion is
    // destroyed and its item dropped.
    LinearPipeline& expand(std::string name, ExpandFn fn);
    // The writer, called serially. It may throw sf::Reject for one item, too.
    LinearPipeline& sink(std::string name, SinkFn fn, SinkOrder order = SinkOrder::kArrival);
    // Called serially, from the sink's thread, once per rejected item.
    LinearPipeline& on_reject(RejectFn fn);
    // Progress counts source items (one is done when it is expanded, completed or rejected): the
    // number of outputs is not known in advance.
    LinearPipeline& progress(ProgressOptions options);
    // Declares that the last declared stage's bodies hold the DeviceLease of `device` (which they
    // still acquire themselves), so that the plan shows which stage keeps a model on the device.
    // Refused for a parallel stage running more than one body.
    LinearPipeline& holds_device_lease(int device = 0);

    // Builds the graph, prints the plan and runs to the end. Throws sf::Error InvalidArgument
    // for an incomplete pipeline, or the first fatal exception of a stage after the graph has
    // drained; stats() is valid in both cases.
    RunStats run();

    // Asks a running pipeline to stop (from any thread, e.g. a SIGINT handler's watcher): like a
    // fatal error, but run() returns normally with stats().cancelled set. The token is never
    // reset, so a cancel() that comes before run() stops it at once.
    void cancel() { cancel_token_.cancel(); }
    const CancelToken& cancel_token() const { return cancel_token_; }

    // Stages, concurrency, the token bounds and the device lease, one line each.
    std::string plan() const;
    const RunStats& stats() const { return stats_; }
    const std::string& name() const { return name_; }
    int max_in_flight() const { return max_in_flight_; }

    struct Stage;  // the declared stages, defined in pipeline_run.h

private:
    LinearPipeline& add_stage(Stage stage);

    std::string name_;
    int max_in_flight_;
    std::vector<Stage> stages_;
    DescribeFn describe_;
    RejectFn on_reject_;
    ProgressOptions progress_;
    int64_t total_ = -1;
    CancelToken cancel_token_;
    RunStats stats_;
};

}  // namespace sf::graph
