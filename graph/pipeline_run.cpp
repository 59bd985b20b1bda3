// The flow-graph runtime behind LinearPipeline.
//
// Shape:  tokens -> [source] -> [stage] -> ... -> [sink] -> tokens
//
// The token pool is the source node's own input queue: the source is a serial node whose input is
// a token, so it runs (and produces one item) only when a token is free. The item carries its
// token through every stage; the sink gives it back with try_put. This bounds the items in
// flight exactly: an input_node joined to a token buffer with a reserving join would pre-fetch
// one item beyond the bound while it waits for a token.
//
// Every item reaches the sink exactly once, as an item, a rejection (payload dropped where it was
// rejected) or a drop (after cancellation), so all accounting and the return of tokens happen in
// one serial place. The function nodes' queues are the default unbounded `queueing` ones, but
// every queued message holds a token, so together they never hold more than the pool.
//
// Parking. A batch stage holds items until its batch fills, and a source-order sink holds items
// until their predecessors arrive; both keep the items' tokens. If every live token is parked,
// nothing can move: e.g. 5 tokens, batch 4, the sink holds items 1..4 waiting for item 0, which
// sits alone in the batch. `active_` counts tokens neither parked nor retired; the thread that
// takes it to 0 pokes the parking nodes, and a batch stage then runs its partial batch. The same
// rule flushes the last partial batch at the end of input (all tokens retire at the source) and
// releases everything parked after a cancellation.
//
// Cancellation. No exception ever escapes a node body into TBB: bodies catch, record the first
// fatal exception, set the cancel token, and mark the item dropped. The source retires tokens
// instead of producing, every stage passes dropped items through without running, parked items
// are released, and the graph drains to idle on its own; run() then rethrows. Nothing relies on
// TBB's task cancellation, which would leave items in node queues unaccounted for.
#include "graph/pipeline_run.h"

#include <fmt/format.h>
#include <tbb/flow_graph.h>

#include <algorithm>
#include <any>
#include <atomic>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/check.h"
#include "core/error.h"
#include "core/log.h"

namespace sf::graph {
namespace {

thread_local const ItemContext* t_current_item = nullptr;

// Sets current_item() for the duration of a stage body.
class ItemScope {
public:
    ItemScope(int64_t index, std::string_view label, const CancelToken* cancel)
        : context_{index, label, cancel}, previous_(t_current_item) {
        t_current_item = &context_;
    }
    ~ItemScope() { t_current_item = previous_; }
    ItemScope(const ItemScope&) = delete;
    ItemScope& operator=(const ItemScope&) = delete;

private:
    ItemContext context_;
    const ItemContext* previous_;
};

struct Msg {
    enum class Kind : uint8_t { kItem, kRejected, kDropped, kPoke };
    Kind kind = Kind::kItem;
    int token = -1;
    int64_t index = -1;
    std::any payload;
    std::string label;
    std::string reject_stage;
    std::string reject_reason;
};
// Shared pointers, because TBB hands bodies a const reference to a copyable message; the body
// then moves the payload out of the pointee instead of copying it.
using MsgPtr = std::shared_ptr<Msg>;

using SourceNode = tbb::flow::multifunction_node<int, std::tuple<MsgPtr>>;
using StageNode = tbb::flow::function_node<MsgPtr, MsgPtr>;
using BatchNode = tbb::flow::multifunction_node<MsgPtr, std::tuple<MsgPtr>>;
using SinkNode = tbb::flow::function_node<MsgPtr, tbb::flow::continue_msg>;
using Stage = LinearPipeline::Stage;

struct StageCounters {
    std::atomic<int64_t> items{0};
    std::atomic<int64_t> rejects{0};
    std::atomic<int64_t> busy_ns{0};
};

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

std::string describe_exception(const std::exception_ptr& error) {
    try {
        std::rethrow_exception(error);
    } catch (const std::exception& e) {
        return e.what();
    } catch (...) {
        return "unknown exception";
    }
}

class GraphRun {
public:
    GraphRun(const detail::RunInput& input);
    void run(RunStats& stats);

private:
    void build();
    void source_body(int token, SourceNode::output_ports_type& ports);
    MsgPtr stage_body(size_t k, const MsgPtr& msg);
    void batch_body(size_t k, const MsgPtr& msg, BatchNode::output_ports_type& ports);
    void batch_in_source_order(size_t k, const MsgPtr& msg, BatchNode::output_ports_type& ports);
    void flush_batch(size_t k, BatchNode::output_ports_type& ports);
    void run_batch(size_t k, BatchNode::output_ports_type& ports);
    void sink_body(const MsgPtr& msg);
    void sink_in_source_order(const MsgPtr& msg);
    void finish(Msg& msg);
    void drop_parked_at_sink();

    bool cancelled() const { return input_.cancel.cancelled(); }
    void fail(std::exception_ptr error, const std::string& stage);
    void reject(Msg& msg, const std::string& stage, const std::string& reason);
    void drop(Msg& msg);
    void retire(int token);
    void park() {
        if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) poke();
    }
    void unpark(int64_t n) { active_.fetch_add(n, std::memory_order_acq_rel); }
    void poke();
    void count_in_flight();

    const detail::RunInput& input_;
    const Stage& source_;
    const Stage& sink_;
    std::unique_ptr<StageCounters[]> counters_;  // one per declared stage
    std::unique_ptr<Progress> progress_;

    std::atomic<int64_t> active_;
    std::atomic<int> in_flight_{0};
    std::atomic<int> max_in_flight_{0};
    std::atomic<int64_t> produced_{0}, completed_{0}, rejected_{0}, dropped_{0};

    // Touched only by the (serial) source body, and read after wait_for_all.
    bool exhausted_ = false;
    int64_t next_index_ = 0;
    std::vector<char> retired_;
    int retired_count_ = 0;

    // Touched only by the serial batch and sink bodies respectively.
    std::vector<std::vector<MsgPtr>> pending_;  // per declared stage; used by batch stages
    std::vector<std::map<int64_t, MsgPtr>> reorder_;  // source-order batch stages: null = a hole
    std::vector<int64_t> next_in_order_;
    std::map<int64_t, MsgPtr> parked_;          // source-order sink: null = a finished hole
    int64_t next_to_sink_ = 0;

    std::mutex error_mutex_;
    std::exception_ptr first_error_;

    const MsgPtr poke_msg_ = [] {
        auto msg = std::make_shared<Msg>();
        msg->kind = Msg::Kind::kPoke;
        return msg;
    }();

    // Declared last: nodes are destroyed before the state their bodies use, and after the graph
    // has drained (the graph's destructor waits; run() has already waited).
    tbb::flow::graph graph_;
    std::unique_ptr<SourceNode> source_node_;
    std::vector<std::unique_ptr<tbb::flow::graph_node>> nodes_;
    std::vector<tbb::flow::receiver<MsgPtr>*> parking_nodes_;
};

GraphRun::GraphRun(const detail::RunInput& input)
    : input_(input),
      source_(input.stages.front()),
      sink_(input.stages.back()),
      counters_(std::make_unique<StageCounters[]>(input.stages.size())),
      active_(input.tokens),
      retired_(input.tokens, 0),
      pending_(input.stages.size()),
      reorder_(input.stages.size()),
      next_in_order_(input.stages.size(), 0) {}

void GraphRun::build() {
    namespace flow = tbb::flow;
    source_node_ = std::make_unique<SourceNode>(
        graph_, flow::serial,
        [this](int token, SourceNode::output_ports_type& ports) { source_body(token, ports); });
    flow::sender<MsgPtr>* tail = &flow::output_port<0>(*source_node_);
    for (size_t k = 1; k + 1 < input_.stages.size(); ++k) {
        const Stage& stage = input_.stages[k];
        if (stage.kind == Stage::Kind::kBatched) {
            auto node = std::make_unique<BatchNode>(
                graph_, flow::serial,
                [this, k](const MsgPtr& msg, BatchNode::output_ports_type& ports) {
                    batch_body(k, msg, ports);
                });
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
    for (int token = 0; token < input_.tokens; ++token) source_node_->try_put(token);
    try {
        graph_.wait_for_all();
    } catch (...) {
        // Bodies catch everything, so this is TBB itself failing (e.g. std::bad_alloc).
        fail(std::current_exception(), "graph");
    }
    progress_->finish();

    // Every token ends retired at the source; anything else means an item was lost or the graph
    // stalled with items parked, both bugs here rather than in stage code.
    SF_CHECK(retired_count_ == input_.tokens, "pipeline: a token was not returned");
    SF_CHECK(parked_.empty(), "pipeline: items left parked at the sink");
    for (const auto& pending : pending_) {
        SF_CHECK(pending.empty(), "pipeline: items left in a partial batch");
    }
    for (const auto& waiting : reorder_) {
        SF_CHECK(waiting.empty(), "pipeline: items left waiting for their turn in a batch");
    }
    SF_CHECK(produced_ == completed_ + rejected_ + dropped_, "pipeline: item accounting");

    stats.produced = produced_;
    stats.completed = completed_;
    stats.rejected = rejected_;
    stats.dropped = dropped_;
    stats.seconds = static_cast<double>(now_ns() - start) * 1e-9;
    stats.max_in_flight_observed = max_in_flight_;
    stats.cancelled = cancelled();
    for (size_t k = 0; k < input_.stages.size(); ++k) {
        stats.stages.push_back({input_.stages[k].name, counters_[k].items.load(),
                                counters_[k].rejects.load(),
                                static_cast<double>(counters_[k].busy_ns.load()) * 1e-9});
    }
    log_info("pipeline {}: {} completed, {} rejected, {} dropped in {:.2f}s{}", input_.name,
             stats.completed, stats.rejected, stats.dropped, stats.seconds,
             stats.cancelled ? " (cancelled)" : "");
    if (first_error_) std::rethrow_exception(first_error_);
}

void GraphRun::source_body(int token, SourceNode::output_ports_type& ports) {
    if (exhausted_ || cancelled()) {
        retire(token);
        return;
    }
    auto msg = std::make_shared<Msg>();
    msg->token = token;
    msg->index = next_index_;
    StageCounters& counters = counters_[0];
    const int64_t start = now_ns();
    bool produced = false;
    try {
        ItemScope scope(msg->index, {}, &input_.cancel);
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
            retire(token);
            return;
        }
        drop(*msg);  // describe() failed on an item that exists: account for it downstream
    }
    counters.busy_ns.fetch_add(now_ns() - start);
    if (!produced) {
        exhausted_ = true;
        retire(token);
        return;
    }
    ++next_index_;
    produced_.fetch_add(1);
    count_in_flight();
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
        ItemScope scope(msg->index, msg->label, &input_.cancel);
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

void GraphRun::batch_body(size_t k, const MsgPtr& msg, BatchNode::output_ports_type& ports) {
    if (input_.stages[k].order == ItemOrder::kSource) {
        batch_in_source_order(k, msg, ports);
        return;
    }
    auto& out = std::get<0>(ports);
    std::vector<MsgPtr>& pending = pending_[k];
    if (msg->kind == Msg::Kind::kItem && !cancelled()) {
        pending.push_back(msg);
        park();
    } else if (msg->kind != Msg::Kind::kPoke) {
        if (msg->kind == Msg::Kind::kItem) drop(*msg);
        out.try_put(msg);
    }
    flush_batch(k, ports);
}

// Items wait (parked) until every earlier index has passed; consecutive items then fill the
// batch, and rejected or dropped ones leave holes. An earlier item still on its way holds an active
// token, so a stall (no active token) means the end of input: only then does a partial batch run,
// and which items share a batch is a function of the source order alone.
void GraphRun::batch_in_source_order(size_t k, const MsgPtr& msg, BatchNode::output_ports_type& ports) {
    auto& out = std::get<0>(ports);
    std::map<int64_t, MsgPtr>& waiting = reorder_[k];
    if (msg->kind == Msg::Kind::kItem && !cancelled()) {
        waiting.emplace(msg->index, msg);
        park();
    } else if (msg->kind != Msg::Kind::kPoke) {
        if (msg->kind == Msg::Kind::kItem) drop(*msg);
        out.try_put(msg);
        waiting.emplace(msg->index, nullptr);  // its place in the order
    }
    if (cancelled()) {
        for (auto& [index, m] : waiting) {
            if (m) pending_[k].push_back(m);  // released with the pending batch below
        }
        waiting.clear();
        flush_batch(k, ports);
        return;
    }
    const auto full = static_cast<size_t>(input_.stages[k].batch_size);
    int64_t& next = next_in_order_[k];
    for (auto it = waiting.begin(); it != waiting.end() && it->first == next; it = waiting.erase(it), ++next) {
        if (!it->second) continue;
        pending_[k].push_back(it->second);
        if (pending_[k].size() >= full) run_batch(k, ports);
    }
    if (!pending_[k].empty() && active_.load(std::memory_order_acquire) == 0) run_batch(k, ports);
}

// Runs the pending batch when it is full or nothing else can come; after a cancellation, drops it.
void GraphRun::flush_batch(size_t k, BatchNode::output_ports_type& ports) {
    auto& out = std::get<0>(ports);
    std::vector<MsgPtr>& pending = pending_[k];
    if (pending.empty()) return;
    if (cancelled()) {
        unpark(static_cast<int64_t>(pending.size()));
        for (const MsgPtr& m : pending) {
            drop(*m);
            out.try_put(m);
        }
        pending.clear();
        return;
    }
    const auto full = static_cast<size_t>(input_.stages[k].batch_size);
    if (pending.size() >= full || active_.load(std::memory_order_acquire) == 0) run_batch(k, ports);
}

void GraphRun::run_batch(size_t k, BatchNode::output_ports_type& ports) {
    const Stage& stage = input_.stages[k];
    StageCounters& counters = counters_[k];
    std::vector<MsgPtr> batch;
    batch.swap(pending_[k]);
    const auto n = static_cast<int64_t>(batch.size());
    unpark(n);
    std::vector<std::any> inputs;
    inputs.reserve(batch.size());
    for (const MsgPtr& m : batch) inputs.push_back(std::move(m->payload));
    const int64_t start = now_ns();
    try {
        ItemScope scope(batch.front()->index, batch.front()->label, &input_.cancel);
        std::vector<std::any> outputs = stage.batch(std::move(inputs));
        if (outputs.size() != batch.size()) {
            throw Error::InvalidArgument(fmt::format("stage {} returned {} outputs for {} inputs",
                                                     stage.name, outputs.size(), batch.size()));
        }
        for (size_t i = 0; i < batch.size(); ++i) batch[i]->payload = std::move(outputs[i]);
        counters.items.fetch_add(n);
    } catch (const Reject& r) {
        for (const MsgPtr& m : batch) reject(*m, stage.name, r.reason());
        counters.rejects.fetch_add(n);
    } catch (...) {
        fail(std::current_exception(), stage.name);
        for (const MsgPtr& m : batch) drop(*m);
    }
    counters.busy_ns.fetch_add(now_ns() - start);
    for (const MsgPtr& m : batch) std::get<0>(ports).try_put(m);
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
    if (msg->index != next_to_sink_) {
        if (msg->kind == Msg::Kind::kItem) {
            parked_.emplace(msg->index, msg);
            park();
        } else {
            // A rejection is reported at once; only its place in the order is kept.
            finish(*msg);
            parked_.emplace(msg->index, nullptr);
        }
        return;
    }
    finish(*msg);
    ++next_to_sink_;
    for (auto it = parked_.begin(); it != parked_.end() && it->first == next_to_sink_;
         it = parked_.erase(it), ++next_to_sink_) {
        if (it->second) {
            unpark(1);
            finish(*it->second);
        }
    }
}

void GraphRun::drop_parked_at_sink() {
    for (auto& [index, msg] : parked_) {
        if (!msg) continue;
        unpark(1);
        drop(*msg);
        finish(*msg);
    }
    parked_.clear();
}

// The one place an item ends: the sink's serial body. Returns the item's token to the pool.
void GraphRun::finish(Msg& msg) {
    StageCounters& counters = counters_[input_.stages.size() - 1];
    if (msg.kind == Msg::Kind::kItem && cancelled()) drop(msg);
    if (msg.kind == Msg::Kind::kItem) {
        const int64_t start = now_ns();
        try {
            ItemScope scope(msg.index, msg.label, &input_.cancel);
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
        log_debug("pipeline {}: {} rejected item {} ({}): {}", input_.name, msg.reject_stage,
                  msg.index, msg.label, msg.reject_reason);
        if (input_.on_reject) {
            try {
                input_.on_reject(
                    RejectInfo{msg.reject_stage, msg.index, msg.label, msg.reject_reason});
            } catch (...) {
                fail(std::current_exception(), "on_reject");
            }
        }
    }
    if (msg.kind == Msg::Kind::kDropped) dropped_.fetch_add(1);
    if (msg.kind != Msg::Kind::kDropped) progress_->advance(1);
    in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    msg.payload.reset();
    source_node_->try_put(msg.token);
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

void GraphRun::retire(int token) {
    SF_CHECK(!retired_[token], "pipeline: token retired twice");
    retired_[token] = 1;
    ++retired_count_;
    park();  // a retired token is as still as a parked one
}

void GraphRun::poke() {
    for (tbb::flow::receiver<MsgPtr>* node : parking_nodes_) node->try_put(poke_msg_);
}

void GraphRun::count_in_flight() {
    const int now = in_flight_.fetch_add(1, std::memory_order_acq_rel) + 1;
    int seen = max_in_flight_.load(std::memory_order_relaxed);
    while (now > seen && !max_in_flight_.compare_exchange_weak(seen, now)) {
    }
}

}  // namespace

const ItemContext* current_item() { return t_current_item; }

namespace detail {

void run_graph(const RunInput& input, RunStats& stats) { GraphRun(input).run(stats); }

}  // namespace detail
}  // namespace sf::graph
