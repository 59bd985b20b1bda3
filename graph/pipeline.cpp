#include "graph/pipeline.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "graph/pipeline_run.h"

namespace sf::graph {

LinearPipeline::LinearPipeline(std::string name, int max_in_flight)
    : name_(std::move(name)), max_in_flight_(max_in_flight) {
    if (max_in_flight < 1) {
        throw Error::InvalidArgument(
            fmt::format("pipeline {}: max_in_flight must be >= 1, got {}", name_, max_in_flight));
    }
}

LinearPipeline::~LinearPipeline() = default;

LinearPipeline& LinearPipeline::add_stage(Stage stage) {
    const bool has_source = !stages_.empty() && stages_.front().kind == Stage::Kind::kSource;
    const bool has_sink = !stages_.empty() && stages_.back().kind == Stage::Kind::kSink;
    auto fail = [&](const std::string& why) {
        return Error::InvalidArgument(
            fmt::format("pipeline {}: stage {}: {}", name_, stage.name, why));
    };
    if (stage.kind == Stage::Kind::kSource) {
        if (!stages_.empty()) throw fail("the source must be declared first, and only once");
        if (!stage.source) throw fail("empty source function");
    } else {
        if (!has_source) throw fail("declare the source first");
        if (has_sink) throw fail("nothing may follow the sink");
    }
    if ((stage.kind == Stage::Kind::kParallel || stage.kind == Stage::Kind::kSerial) && !stage.fn) {
        throw fail("empty stage function");
    }
    if (stage.kind == Stage::Kind::kParallel && stage.concurrency < 1) {
        throw fail(fmt::format("concurrency must be >= 1, got {}", stage.concurrency));
    }
    if (stage.kind == Stage::Kind::kBatched) {
        if (!stage.batch) throw fail("empty batch function");
        // A batch waits for batch_size items, each holding a token: with fewer tokens it could
        // never fill.
        if (stage.batch_size < 1 || stage.batch_size > max_in_flight_) {
            throw fail(fmt::format("batch size {} must be in [1, max_in_flight = {}]",
                                   stage.batch_size, max_in_flight_));
        }
    }
    if (stage.kind == Stage::Kind::kExpand) {
        if (!stage.expand) throw fail("empty expand function");
        for (const Stage& other : stages_) {
            if (other.kind == Stage::Kind::kExpand) {
                throw fail(fmt::format("a pipeline has at most one expand stage, and {} is one",
                                       other.name));
            }
        }
    }
    if (stage.kind == Stage::Kind::kSink && !stage.sink) throw fail("empty sink function");
    stages_.push_back(std::move(stage));
    return *this;
}

LinearPipeline& LinearPipeline::source(std::string name, SourceFn fn, int64_t total) {
    Stage stage;
    stage.kind = Stage::Kind::kSource;
    stage.name = std::move(name);
    stage.source = std::move(fn);
    add_stage(std::move(stage));
    total_ = total;
    return *this;
}

LinearPipeline& LinearPipeline::describe(DescribeFn fn) {
    describe_ = std::move(fn);
    return *this;
}

LinearPipeline& LinearPipeline::parallel(std::string name, int concurrency, StageFn fn) {
    Stage stage;
    stage.kind = Stage::Kind::kParallel;
    stage.name = std::move(name);
    stage.concurrency = concurrency;
    stage.fn = std::move(fn);
    return add_stage(std::move(stage));
}

LinearPipeline& LinearPipeline::serial(std::string name, StageFn fn) {
    Stage stage;
    stage.kind = Stage::Kind::kSerial;
    stage.name = std::move(name);
    stage.fn = std::move(fn);
    return add_stage(std::move(stage));
}

LinearPipeline& LinearPipeline::serial_batched(std::string name, int batch_size, BatchFn fn,
                                               ItemOrder order) {
    Stage stage;
    stage.kind = Stage::Kind::kBatched;
    stage.name = std::move(name);
    stage.batch_size = batch_size;
    stage.batch = std::move(fn);
    stage.order = order;
    return add_stage(std::move(stage));
}

LinearPipeline& LinearPipeline::expand(std::string name, ExpandFn fn) {
    Stage stage;
    stage.kind = Stage::Kind::kExpand;
    stage.name = std::move(name);
    stage.expand = std::move(fn);
    return add_stage(std::move(stage));
}

LinearPipeline& LinearPipeline::sink(std::string name, SinkFn fn, SinkOrder order) {
    Stage stage;
    stage.kind = Stage::Kind::kSink;
    stage.name = std::move(name);
    stage.sink = std::move(fn);
    stage.order = order;
    return add_stage(std::move(stage));
}

LinearPipeline& LinearPipeline::on_reject(RejectFn fn) {
    on_reject_ = std::move(fn);
    return *this;
}

LinearPipeline& LinearPipeline::progress(ProgressOptions options) {
    progress_ = options;
    return *this;
}

LinearPipeline& LinearPipeline::holds_device_lease(int device) {
    if (stages_.empty()) {
        throw Error::InvalidArgument(fmt::format(
            "pipeline {}: holds_device_lease() names the last declared stage; there is none",
            name_));
    }
    Stage& stage = stages_.back();
    auto fail = [&](const std::string& why) {
        return Error::InvalidArgument(
            fmt::format("pipeline {}: stage {}: {}", name_, stage.name, why));
    };
    if (device < 0) throw fail(fmt::format("device lease of device {}: no such device", device));
    // The lease is one token per device: several bodies of one stage would only wait for each
    // other, each holding a worker thread while it waits.
    if (stage.kind == Stage::Kind::kParallel && stage.concurrency > 1) {
        throw fail(
            fmt::format("runs {} bodies at once, so it cannot hold the device lease; "
                        "declare it serial",
                        stage.concurrency));
    }
    stage.device_lease = device;
    return *this;
}

std::string LinearPipeline::plan() const {
    const char* plural = max_in_flight_ == 1 ? "" : "s";
    std::string text = fmt::format("pipeline {}: at most {} item{} in flight (token pool)", name_,
                                   max_in_flight_, plural);
    for (const Stage& stage : stages_) {
        if (stage.kind == Stage::Kind::kExpand) {
            text += fmt::format(", and {} output{} of {} (second pool)", max_in_flight_, plural,
                                stage.name);
        }
    }
    for (const Stage& stage : stages_) {
        const char* kind = "";
        std::string detail;
        switch (stage.kind) {
            case Stage::Kind::kSource:
                kind = "source";
                detail = "x1";
                break;
            case Stage::Kind::kParallel:
                kind = "parallel";
                detail = fmt::format("x{}", stage.concurrency);
                break;
            case Stage::Kind::kSerial:
                kind = "serial";
                detail = "x1";
                break;
            case Stage::Kind::kBatched:
                kind = "batched";
                detail = fmt::format("x1, batch {}{}", stage.batch_size,
                                     stage.order == ItemOrder::kSource ? ", source order" : "");
                break;
            case Stage::Kind::kExpand:
                kind = "expand";
                detail = fmt::format("x1, source order, outputs take the second pool ({} tokens)",
                                     max_in_flight_);
                break;
            case Stage::Kind::kSink:
                kind = "sink";
                detail = stage.order == SinkOrder::kSource ? "x1, source order" : "x1";
                break;
        }
        if (stage.device_lease == 0) {
            detail += ", holds the device lease";
        } else if (stage.device_lease > 0) {
            detail += fmt::format(", holds the device lease of device {}", stage.device_lease);
        }
        text += fmt::format("\n  {:<9}{:<20} {}", kind, stage.name, detail);
    }
    return text;
}

RunStats LinearPipeline::run() {
    stats_ = RunStats();
    stats_.tokens = max_in_flight_;
    if (stages_.empty() || stages_.front().kind != Stage::Kind::kSource ||
        stages_.back().kind != Stage::Kind::kSink) {
        throw Error::InvalidArgument(
            fmt::format("pipeline {}: needs a source and a sink before run()", name_));
    }
    log_info("{}", plan());
    detail::RunInput input{name_,      max_in_flight_, stages_, describe_,
                           on_reject_, progress_,      total_,  cancel_token_};
    detail::run_graph(input, stats_);
    return stats_;
}

}  // namespace sf::graph
