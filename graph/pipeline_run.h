// Internal to graph/: the declared stages of a LinearPipeline and the entry point of the flow-graph
// runtime (graph_run.h, the only header that includes TBB).
#pragma once

#include <string>
#include <vector>

#include "graph/pipeline.h"

namespace sf::graph {

struct LinearPipeline::Stage {
    enum class Kind { kSource, kParallel, kSerial, kBatched, kExpand, kSink };
    Kind kind = Kind::kSerial;
    std::string name;
    int concurrency = 1;
    int batch_size = 1;
    SourceFn source;
    StageFn fn;
    BatchFn batch;
    ExpandFn expand;
    SinkFn sink;
    SinkOrder order = SinkOrder::kArrival;
    int device_lease = -1;  // the device whose lease the bodies hold, for the plan; -1: none
};

namespace detail {

struct RunInput {
    const std::string& name;
    int tokens;
    const std::vector<LinearPipeline::Stage>& stages;  // source first, sink last
    const LinearPipeline::DescribeFn& describe;
    const LinearPipeline::RejectFn& on_reject;
    const ProgressOptions& progress;
    int64_t total;
    CancelToken& cancel;
};

// Runs the graph to the end; fills `stats` and rethrows the first fatal exception, if any.
void run_graph(const RunInput& input, RunStats& stats);

}  // namespace detail
}  // namespace sf::graph
