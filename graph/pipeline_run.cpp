// The runtime of graph_run.h: building the graph, the token pools, the source, the plain stages,
// the sink, and the accounting that every run must balance.
#include "graph/pipeline_run.h"

#include <fmt/format.h>

#include "core/check.h"
#include "core/error.h"
#include "core/log.h"
#include "graph/graph_run.h"

namespace sf::graph {
namespace {

thread_local const ItemContext* t_current_item = nullptr;

std::string describe_exception(const std::exception_ptr& error) {
    try {
        std::rethrow_exception(error);
    } catch (const std::exception& e) {
        return e.what();
    } catch (...) {
        return "unknown exception";
    }
}

size_t find_expand_stage(const std::vector<LinearPipeline::Stage>& stages) {
    for (size_t k = 1; k + 1 < stages.size(); ++k) {
        if (stages[k].kind == LinearPipeline::Stage::Kind::kExpand) return k;
    }
    return 0;
}

}  // namespace

const ItemContext* current_item() { return t_current_item; }

namespace detail {
namespace {

MsgPtr token_message(int token) {
    auto msg = std::make_shared<Msg>();
    msg->kind = Msg::Kind::kToken;
    msg->pool = Msg::Pool::kOutput;
    msg->token = token;
    return msg;
}

}  // namespace

ItemScope::ItemScope(const Msg& msg, const CancelToken* cancel)
    : context_{msg.index, msg.label, cancel, msg.sub}, previous_(t_current_item) {
    t_current_item = &context_;
}

ItemScope::~ItemScope() { t_current_item = previous_; }

GraphRun::GraphRun(const RunInput& input)
    : input_(input),
      source_(input.stages.front()),
      sink_(input.stages.back()),
      expand_k_(find_expand_stage(input.stages)),
      counters_(std::make_unique<StageCounters[]>(input.stages.size())),
      active_(expand_k_ ? 2 * input.tokens : input.tokens),
      source_retired_(input.tokens),
      cutters_(input.stages.size()),
      output_retired_(expand_k_ ? input.tokens : 0) {
    for (size_t k = 0; k < input.stages.size(); ++k) {
        const Stage& stage = input.stages[k];
        if (stage.kind == Stage::Kind::kBatched) {
            cutters_[k] = std::make_unique<BatchCutter<MsgPtr>>(
                static_cast<size_t>(stage.batch_size), stage.order);
        }
    }
}

void GraphRun::build() {
    namespace flow = tbb::flow;
    source_node_ = std::make_unique<SourceNode>(
        graph_, flow::serial,
        [this](int token, SourceNode::output_ports_type& ports) { source_body(token, ports); });
    flow::sender<MsgPtr>* tail = &flow::output_port<0>(*source_node_);
    for (size_t k = 1; k + 1 < input_.stages.size(); ++k) {
        const Stage& stage = input_.stages[k];
        if (stage.kind == Stage::Kind::kBatched || stage.kind == Stage::Kind::kExpand) {
            std::unique_ptr<BatchNode> node;
            if (stage.kind == Stage::Kind::kBatched) {
                node = std::make_unique<BatchNode>(
                    graph_, flow::serial,
                    [this, k](const MsgPtr& msg, OutPort& ports) { batch_body(k, msg, ports); });
            } else {
                node = std::make_unique<ExpandNode>(
                    graph_, flow::serial,
                    [this](const MsgPtr& msg, OutPort& ports) { expand_body(msg, ports); });
                expand_node_ = node.get();
            }
            flow::make_edge(*tail, *node);
            tail = &flow::output_port<0>(*node);
            parking_nodes_.push_back(node.get());
            nodes_.push_back(std::move(node));
        } else {
            const size_t concurrency = stage.kind == Stage::Kind::kParallel
                                           ? static_cast<size_t>(stage.concurrency)
                                           : static_cast<size_t>(flow::serial);
            auto node = std::make_unique<StageNode>(
                graph_, concurrency, [this, k](const MsgPtr& msg) { return stage_body(k, msg); });
            flow::make_edge(*tail, *node);
            tail = node.get();
            nodes_.push_back(std::move(node));
        }
    }
    auto sink = std::make_unique<SinkNode>(graph_, flow::serial, [this](const MsgPtr& msg) {
        sink_body(msg);
        return flow::continue_msg();
    });
    flow::make_edge(*tail, *sink);
    if (sink_.order == SinkOrder::kSource) parking_nodes_.push_back(sink.get());
    nodes_.push_back(std::move(sink));
}

void GraphRun::run(RunStats& stats) {
    const int64_t start = now_ns();
    build();
    progress_ = std::make_unique<Progress>(input_.name, input_.total, input_.progress);
    // Tokens go in only now that every edge exists: the source starts with the first one.
    if (expand_node_) {
        for (int token = 0; token < input_.tokens; ++token) {
            expand_node_->try_put(token_message(token));
        }
    }
    for (int token = 0; token < input_.tokens; ++token) source_node_->try_put(token);
    try {
        graph_.wait_for_all();
    } catch (...) {
        // Bodies catch everything, so this is TBB itself failing (e.g. std::bad_alloc).
        fail(std::current_exception(), "graph");
    }
    progress_->finish();
    check_drained();

    stats.produced = produced_;
    stats.outputs = outputs_;
    stats.expanded = expanded_;
    stats.completed = completed_;
    stats.rejected = rejected_;
    stats.dropped = dropped_;
    stats.seconds = static_cast<double>(now_ns() - start) * 1e-9;
    stats.max_inputs_in_flight_observed = inputs_in_flight_.max;
    stats.max_in_flight_observed =
        expand_node_ ? outputs_in_flight_.max.load() : inputs_in_flight_.max.load();
    stats.cancelled = cancelled();
    for (size_t k = 0; k < input_.stages.size(); ++k) {
        stats.stages.push_back({input_.stages[k].name, counters_[k].items.load(),
                                counters_[k].rejects.load(),
                                static_cast<double>(counters_[k].busy_ns.load()) * 1e-9});
    }
    if (expand_node_) {
        log_info(
            "pipeline {}: {} items expanded into {} outputs; {} completed, {} rejected, {} "
            "dropped in {:.2f}s{}",
            input_.name, stats.expanded, stats.outputs, stats.completed, stats.rejected,
            stats.dropped, stats.seconds, stats.cancelled ? " (cancelled)" : "");
    } else {
        log_info("pipeline {}: {} completed, {} rejected, {} dropped in {:.2f}s{}", input_.name,
                 stats.completed, stats.rejected, stats.dropped, stats.seconds,
                 stats.cancelled ? " (cancelled)" : "");
    }
    if (first_error_) std::rethrow_exception(first_error_);
}

// Every token ends retired, by the node whose pool it is; anything else means an item was lost or
// the graph stalled with items parked, both bugs here rather than in stage code.
void GraphRun::check_drained() const {
    SF_CHECK(source_retired_.count == input_.tokens, "pipeline: a token was not returned");
    if (expand_node_) {
        SF_CHECK(output_retired_.count == input_.tokens,
                 "pipeline: an output token was not returned");
        SF_CHECK(expand_waiting_.empty() && !open_input_ && !open_next_ && free_tokens_.empty(),
                 "pipeline: items or tokens left at the expand stage");
    }
    SF_CHECK(active_.load() == 0, "pipeline: token count off");
    SF_CHECK(sink_order_.empty(), "pipeline: items left parked at the sink");
    for (const auto& cutter : cutters_) {
        SF_CHECK(!cutter || cutter->empty(), "pipeline: items left in a batch stage");
    }
    SF_CHECK(inputs_in_flight_.now == 0 && outputs_in_flight_.now == 0,
             "pipeline: items in flight after the end");
    SF_CHECK(produced_ + outputs_ == expanded_ + completed_ + rejected_ + dropped_,
             "pipeline: item accounting");
}

void GraphRun::source_body(int token, SourceNode::output_ports_type& ports) {
    if (exhausted_ || cancelled()) {
        source_retired_.retire(token);
        park(1);  // a retired token is as still as a parked one
        return;
    }
    auto msg = std::make_shared<Msg>();
    msg->token = token;
    msg->index = next_index_;
    msg->order = next_index_;
    StageCounters& counters = counters_[0];
    const int64_t start = now_ns();
    bool produced = false;
    try {
        ItemScope scope(*msg, &input_.cancel);
        produced = source_.source(msg->payload);
        if (produced) {
            counters.items.fetch_add(1);
            if (input_.describe) msg->label = input_.describe(msg->payload);
        }
    } catch (const Reject& r) {
        produced = true;
        reject(*msg, source_.name, r.reason());
        counters.rejects.fetch_add(1);
    } catch (...) {
        fail(std::current_exception(), source_.name);
        if (!produced) {
            counters.busy_ns.fetch_add(now_ns() - start);
            source_retired_.retire(token);
            park(1);
            return;
        }
        drop(*msg);  // describe() failed on an item that exists: account for it downstream
    }
    counters.busy_ns.fetch_add(now_ns() - start);
    if (!produced) {
        exhausted_ = true;
        // The expand stage ends (retires its output tokens) once it has seen every source item;
        // the poke makes sure it looks again now that it can know how many there are.
        source_total_.store(next_index_, std::memory_order_release);
        if (expand_node_) expand_node_->try_put(poke_msg_);
        source_retired_.retire(token);
        park(1);
        return;
    }
    ++next_index_;
    produced_.fetch_add(1);
    inputs_in_flight_.enter();
    std::get<0>(ports).try_put(msg);
}

MsgPtr GraphRun::stage_body(size_t k, const MsgPtr& msg) {
    if (msg->kind != Msg::Kind::kItem) return msg;
    if (cancelled()) {
        drop(*msg);
        return msg;
    }
    const Stage& stage = input_.stages[k];
    StageCounters& counters = counters_[k];
    const int64_t start = now_ns();
    try {
        ItemScope scope(*msg, &input_.cancel);
        msg->payload = stage.fn(std::move(msg->payload));
        counters.items.fetch_add(1);
    } catch (const Reject& r) {
        reject(*msg, stage.name, r.reason());
        counters.rejects.fetch_add(1);
    } catch (...) {
        fail(std::current_exception(), stage.name);
        drop(*msg);
    }
    counters.busy_ns.fetch_add(now_ns() - start);
    return msg;
}

void GraphRun::sink_body(const MsgPtr& msg) {
    if (sink_.order == SinkOrder::kSource) {
        sink_in_source_order(msg);
    } else if (msg->kind != Msg::Kind::kPoke) {
        finish(*msg);
    }
}

void GraphRun::sink_in_source_order(const MsgPtr& msg) {
    if (cancelled()) {
        drop_parked_at_sink();
        if (msg->kind != Msg::Kind::kPoke) finish(*msg);
        return;
    }
    if (msg->kind == Msg::Kind::kPoke) return;  // a stall is never the sink's to resolve
    Parking parking(*this);
    if (msg->kind == Msg::Kind::kItem) {
        sink_order_.put(msg->order, msg);
        parking.add();
    } else {
        // A rejection is reported at once; only its place in the order is kept.
        finish(*msg);
        sink_order_.put(msg->order, nullptr);
    }
    MsgPtr next;
    while (sink_order_.pop(next)) {
        unpark();
        finish(*next);
    }
}

void GraphRun::drop_parked_at_sink() {
    for (const MsgPtr& msg : sink_order_.take_all()) {
        unpark();
        drop(*msg);
        finish(*msg);
    }
}

// The one place an item ends (but for a source item whose expansion ends): the sink's serial
// body. Returns the item's token to its pool.
void GraphRun::finish(Msg& msg) {
    StageCounters& counters = counters_[input_.stages.size() - 1];
    if (msg.kind == Msg::Kind::kItem && cancelled()) drop(msg);
    if (msg.kind == Msg::Kind::kItem) {
        const int64_t start = now_ns();
        try {
            ItemScope scope(msg, &input_.cancel);
            sink_.sink(std::move(msg.payload));
            counters.items.fetch_add(1);
            completed_.fetch_add(1);
        } catch (const Reject& r) {
            reject(msg, sink_.name, r.reason());
            counters.rejects.fetch_add(1);
        } catch (...) {
            fail(std::current_exception(), sink_.name);
            drop(msg);
        }
        counters.busy_ns.fetch_add(now_ns() - start);
    }
    if (msg.kind == Msg::Kind::kRejected) {
        rejected_.fetch_add(1);
        log_debug("pipeline {}: {} rejected item {}{} ({}): {}", input_.name, msg.reject_stage,
                  msg.index, msg.sub >= 0 ? fmt::format(".{}", msg.sub) : "", msg.label,
                  msg.reject_reason);
        if (input_.on_reject) {
            try {
                input_.on_reject(
                    RejectInfo{msg.reject_stage, msg.index, msg.label, msg.reject_reason, msg.sub});
            } catch (...) {
                fail(std::current_exception(), "on_reject");
            }
        }
    }
    if (msg.kind == Msg::Kind::kDropped) dropped_.fetch_add(1);
    // Progress counts source items; the expand stage counts those it expands.
    if (msg.kind != Msg::Kind::kDropped && msg.sub < 0) progress_->advance(1);
    return_token(msg);
}

void GraphRun::return_token(Msg& msg) {
    // The payload goes before the token: the next item made with it must not meet this one.
    msg.payload.reset();
    if (msg.pool == Msg::Pool::kOutput) {
        outputs_in_flight_.leave();
        expand_node_->try_put(token_message(msg.token));
    } else {
        inputs_in_flight_.leave();
        source_node_->try_put(msg.token);
    }
}

void GraphRun::fail(std::exception_ptr error, const std::string& stage) {
    {
        std::lock_guard<std::mutex> lock(error_mutex_);
        // After a cancellation, stage code is expected to throw (Cancelled, or whatever its
        // interrupted work raises); only the cause of the cancellation is reported.
        if (first_error_ || cancelled()) {
            log_debug("pipeline {}: stage {} after cancellation: {}", input_.name, stage,
                      describe_exception(error));
            return;
        }
        first_error_ = error;
        input_.cancel.cancel();
    }
    log_error("pipeline {}: stage {} failed, cancelling: {}", input_.name, stage,
              describe_exception(error));
}

void GraphRun::reject(Msg& msg, const std::string& stage, const std::string& reason) {
    msg.kind = Msg::Kind::kRejected;
    msg.reject_stage = stage;
    msg.reject_reason = reason;
    msg.payload.reset();
}

void GraphRun::drop(Msg& msg) {
    msg.kind = Msg::Kind::kDropped;
    msg.payload.reset();
}

void GraphRun::poke() {
    for (tbb::flow::receiver<MsgPtr>* node : parking_nodes_) node->try_put(poke_msg_);
}

void run_graph(const RunInput& input, RunStats& stats) { GraphRun(input).run(stats); }

}  // namespace detail
}  // namespace sf::graph
