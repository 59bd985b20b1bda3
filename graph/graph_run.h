// Internal to graph/, and the only header that includes TBB: the flow-graph runtime behind
// LinearPipeline. pipeline_run.cpp holds the runtime (tokens, source, stages, sink, accounting),
// batch_stage.cpp the batch stage's body and expand_stage.cpp the expand stage's.
//
// Shape:  tokens -> [source] -> [stage] -> ... -> [sink] -> tokens
//
// and with an expand stage, a second pool from it to the sink and back:
//
//     tokens -> [source] -> ... -> [expand] -> ... -> [sink] -> output tokens -> [expand]
//
// where a source item's token goes back to the source from the expand stage when its expansion
// ends (from the sink, for an item rejected or dropped before then).
//
// The token pool is the source node's own input queue: the source is a serial node whose input is
// a token, so it runs (and produces one item) only when a token is free. The item carries its
// token through every stage; the sink gives it back with try_put. This bounds the items in
// flight exactly: an input_node joined to a token buffer with a reserving join would pre-fetch
// one item beyond the bound while it waits for a token. The expand stage is built the same way:
// the output pool's tokens arrive in its input queue as kToken messages, and an output is made
// only when one is free. A source item's token goes back to the source when its expansion ends.
//
// Every item reaches the sink exactly once, as an item, a rejection (payload dropped where it was
// rejected) or a drop (after cancellation), so most accounting and the return of tokens happen in
// one serial place; the exception is a source item whose expansion ran to its end, which ends at
// the expand stage (its outputs go on). The function nodes' queues are the default unbounded
// `queueing` ones, but every queued message holds a token (or is a poke), so together they never
// hold more than the pools.
//
// Parking. A batch stage holds items until its batch fills, a source-order sink holds items until
// their predecessors arrive, and the expand stage holds the items waiting for their turn, the one
// it is expanding and its free output tokens; all keep their tokens. If every live token is
// parked, nothing can move: e.g. 5 tokens, batch 4, the sink holds items 1..4 waiting for item 0,
// which sits alone in the batch. `active_` counts tokens neither parked nor retired; the thread
// that takes it to 0 pokes the parking nodes, and a batch stage then runs its partial batch. The
// same rule flushes the last partial batch at the end of input (all tokens retire) and releases
// everything parked after a cancellation. A body's own parks take effect when it returns (see
// Parking), so no other node ever sees a 0 that lasts only while a body moves tokens. Free output
// tokens count as parked: the expand stage keeps one only when it cannot use it, e.g. while the
// next item sits alone in a batch stage before it, and counting it active would hide that stall.
//
// Cancellation. No exception ever escapes a node body into TBB: bodies catch, record the first
// fatal exception, set the cancel token, and mark the item dropped. The source retires tokens
// instead of producing, every stage passes dropped items through without running, the expand
// stage abandons its expansion and retires its output tokens, parked items are released, and the
// graph drains to idle on its own; run() then rethrows. Nothing relies on TBB's task
// cancellation, which would leave items in node queues unaccounted for.
#pragma once

#include <tbb/flow_graph.h>

#include <any>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "core/check.h"
#include "graph/item_order.h"
#include "graph/pipeline_run.h"

namespace sf::graph::detail {

struct Msg {
    enum class Kind : uint8_t { kItem, kRejected, kDropped, kPoke, kToken };
    enum class Pool : uint8_t { kSource, kOutput };  // whose token this message holds
    Kind kind = Kind::kItem;
    Pool pool = Pool::kSource;
    int token = -1;
    int64_t index = -1;  // source order
    int64_t sub = -1;    // among its source item's outputs; -1 for the source item
    // Consecutive position for the source-order stages: the source index before the expand
    // stage; after it, the order the expand stage emitted in, which is (index, sub) order.
    int64_t order = -1;
    std::any payload;
    std::string label;
    std::string reject_stage;
    std::string reject_reason;
};
// Shared pointers, because TBB hands bodies a const reference to a copyable message; the body
// then moves the payload out of the pointee instead of copying it.
using MsgPtr = std::shared_ptr<Msg>;

inline int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Sets current_item() for the duration of a stage body.
class ItemScope {
public:
    ItemScope(const Msg& msg, const CancelToken* cancel);
    ~ItemScope();
    ItemScope(const ItemScope&) = delete;
    ItemScope& operator=(const ItemScope&) = delete;

private:
    ItemContext context_;
    const ItemContext* previous_;
};

struct StageCounters {
    std::atomic<int64_t> items{0};
    std::atomic<int64_t> rejects{0};
    std::atomic<int64_t> busy_ns{0};
};

// A count that several threads move, and its high-water mark.
struct InFlight {
    std::atomic<int> now{0};
    std::atomic<int> max{0};
    void enter() {
        const int n = now.fetch_add(1, std::memory_order_acq_rel) + 1;
        int seen = max.load(std::memory_order_relaxed);
        while (n > seen && !max.compare_exchange_weak(seen, n)) {
        }
    }
    void leave() { now.fetch_sub(1, std::memory_order_acq_rel); }
};

// Which tokens of a pool have retired. Each pool is retired from one serial body only (the
// source's, the expand stage's), so it needs no lock.
struct RetiredTokens {
    explicit RetiredTokens(int tokens) : retired(static_cast<size_t>(tokens), 0) {}
    void retire(int token) {
        SF_CHECK(!retired[static_cast<size_t>(token)], "pipeline: token retired twice");
        retired[static_cast<size_t>(token)] = 1;
        ++count;
    }
    std::vector<char> retired;
    int count = 0;
};

class GraphRun {
public:
    explicit GraphRun(const RunInput& input);
    void run(RunStats& stats);

private:
    using Stage = LinearPipeline::Stage;
    using SourceNode = tbb::flow::multifunction_node<int, std::tuple<MsgPtr>>;
    using StageNode = tbb::flow::function_node<MsgPtr, MsgPtr>;
    using BatchNode = tbb::flow::multifunction_node<MsgPtr, std::tuple<MsgPtr>>;
    using ExpandNode = tbb::flow::multifunction_node<MsgPtr, std::tuple<MsgPtr>>;
    using SinkNode = tbb::flow::function_node<MsgPtr, tbb::flow::continue_msg>;
    using OutPort = tbb::flow::multifunction_node<MsgPtr, std::tuple<MsgPtr>>::output_ports_type;

    // Parks a body makes take effect when it returns, after its unparks: `active_` then never
    // passes through 0 while the body is still moving tokens, and a batch stage that saw such a
    // 0 would cut a partial batch that timing alone decided.
    class Parking {
    public:
        explicit Parking(GraphRun& run) : run_(run) {}
        ~Parking() {
            if (n_ > 0) run_.park(n_);
        }
        Parking(const Parking&) = delete;
        Parking& operator=(const Parking&) = delete;
        void add() { ++n_; }
        // Whether every token will be parked or retired once this body's parks take effect.
        bool stalled() const { return run_.active_.load(std::memory_order_acquire) == n_; }

    private:
        GraphRun& run_;
        int64_t n_ = 0;
    };

    // pipeline_run.cpp
    void build();
    void check_drained() const;
    void source_body(int token, SourceNode::output_ports_type& ports);
    MsgPtr stage_body(size_t k, const MsgPtr& msg);
    void sink_body(const MsgPtr& msg);
    void sink_in_source_order(const MsgPtr& msg);
    void drop_parked_at_sink();
    void finish(Msg& msg);
    void return_token(Msg& msg);
    bool cancelled() const { return input_.cancel.cancelled(); }
    void fail(std::exception_ptr error, const std::string& stage);
    void reject(Msg& msg, const std::string& stage, const std::string& reason);
    void drop(Msg& msg);
    void park(int64_t n) {
        if (active_.fetch_sub(n, std::memory_order_acq_rel) == n) poke();
    }
    void unpark(int64_t n = 1) { active_.fetch_add(n, std::memory_order_acq_rel); }
    void poke();

    // batch_stage.cpp
    void batch_body(size_t k, const MsgPtr& msg, OutPort& ports);
    void run_batch(size_t k, std::vector<MsgPtr> batch, OutPort& ports);

    // expand_stage.cpp
    void expand_body(const MsgPtr& msg, OutPort& ports);
    bool expand_step(OutPort& ports);
    void expand_open(MsgPtr input, OutPort& ports);
    void expand_next(OutPort& ports);
    MsgPtr close_expansion();
    void expand_cancel(OutPort& ports);
    void expand_end();
    void emit(MsgPtr msg, OutPort& ports);

    const RunInput& input_;
    const Stage& source_;
    const Stage& sink_;
    const size_t expand_k_;  // the expand stage's index in input_.stages; 0: none
    std::unique_ptr<StageCounters[]> counters_;  // one per declared stage
    std::unique_ptr<Progress> progress_;

    std::atomic<int64_t> active_;
    InFlight inputs_in_flight_;   // source items holding a token of the source's pool
    InFlight outputs_in_flight_;  // outputs of the expand stage
    std::atomic<int64_t> produced_{0}, outputs_{0}, expanded_{0};
    std::atomic<int64_t> completed_{0}, rejected_{0}, dropped_{0};

    // Touched only by the (serial) source body, and read after wait_for_all.
    bool exhausted_ = false;
    int64_t next_index_ = 0;
    RetiredTokens source_retired_;
    // The number of source items once the source is exhausted, for the expand stage; -1 before.
    std::atomic<int64_t> source_total_{-1};

    // Touched only by the serial batch, expand and sink bodies respectively.
    std::vector<std::unique_ptr<BatchCutter<MsgPtr>>> cutters_;  // per declared stage
    ConsecutiveOrder<MsgPtr> expand_waiting_;                    // source items, by index
    MsgPtr open_input_;                                          // the source item being expanded
    LinearPipeline::SourceFn open_next_;                         // its next function
    int64_t next_sub_ = 0;
    std::vector<int> free_tokens_;  // of the output pool
    int64_t next_order_ = 0;        // of the expand stage's emissions
    RetiredTokens output_retired_;
    ConsecutiveOrder<MsgPtr> sink_order_;  // source-order sink: null = a finished hole

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
    ExpandNode* expand_node_ = nullptr;  // owned by nodes_
    std::vector<std::unique_ptr<tbb::flow::graph_node>> nodes_;
    std::vector<tbb::flow::receiver<MsgPtr>*> parking_nodes_;
};

}  // namespace sf::graph::detail
