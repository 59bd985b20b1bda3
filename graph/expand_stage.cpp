// The expand stage's body. It is serial and takes source items strictly in source order, one
// expansion open at a time, so the sequence it emits in (Msg::order) is (source index, sub index)
// order whatever order the stages before it finished the items in; items rejected before it are
// passed on at their turn, as holes. Its input queue is also the output pool: an output is made
// only with a free output token, so the next function is never called without one.
//
// What it holds is parked: the items waiting for their turn, the item being expanded (whose
// source token stays with it until the expansion ends) and the free output tokens. So with one
// batch stage after it, a stall means the end of input: the token a source-order batch lacks is
// on an output moving towards it, or free here while the next item is still on its way (active),
// or held by an open expansion only while every other token is in the batch, which is then full.
#include <fmt/format.h>

#include "core/error.h"
#include "graph/graph_run.h"

namespace sf::graph::detail {

void GraphRun::expand_body(const MsgPtr& msg, OutPort& ports) {
    Parking parking(*this);
    if (msg->kind == Msg::Kind::kToken) {
        free_tokens_.push_back(msg->token);
        parking.add();
    } else if (msg->kind != Msg::Kind::kPoke) {
        expand_waiting_.put(msg->index, msg);
        parking.add();
    }
    while (!cancelled() && expand_step(ports)) {
    }
    if (cancelled()) {
        expand_cancel(ports);
    } else if (!open_next_ &&
               source_total_.load(std::memory_order_acquire) == expand_waiting_.next()) {
        expand_end();  // every source item has been seen
    }
}

// Makes one output, ends an expansion, opens the next one, or passes on an item rejected before
// this stage. False when nothing can be done before another message arrives.
bool GraphRun::expand_step(OutPort& ports) {
    if (open_next_) {
        if (free_tokens_.empty()) return false;
        expand_next(ports);
        return true;
    }
    MsgPtr input;
    if (!expand_waiting_.pop(input)) return false;
    if (input->kind == Msg::Kind::kItem) {
        expand_open(std::move(input), ports);
    } else {
        unpark();
        emit(std::move(input), ports);
    }
    return true;
}

void GraphRun::expand_open(MsgPtr input, OutPort& ports) {
    const Stage& stage = input_.stages[expand_k_];
    StageCounters& counters = counters_[expand_k_];
    const int64_t start = now_ns();
    try {
        ItemScope scope(*input, &input_.cancel);
        LinearPipeline::SourceFn next = stage.expand(std::move(input->payload));
        if (!next) {
            throw Error::InvalidArgument(fmt::format(
                "stage {} returned an empty next function for item {}", stage.name, input->index));
        }
        open_next_ = std::move(next);
        open_input_ = std::move(input);
        next_sub_ = 0;
    } catch (const Reject& r) {
        reject(*input, stage.name, r.reason());
        counters.rejects.fetch_add(1);
    } catch (...) {
        fail(std::current_exception(), stage.name);
        drop(*input);
    }
    counters.busy_ns.fetch_add(now_ns() - start);
    if (input) {  // not opened: it goes on as a rejection or a drop
        unpark();
        emit(std::move(input), ports);
    }
}

void GraphRun::expand_next(OutPort& ports) {
    const Stage& stage = input_.stages[expand_k_];
    StageCounters& counters = counters_[expand_k_];
    auto output = std::make_shared<Msg>();
    output->pool = Msg::Pool::kOutput;
    output->index = open_input_->index;
    output->sub = next_sub_;
    output->label = open_input_->label;
    const int64_t start = now_ns();
    bool more = false;
    MsgPtr ended;  // the source item, when this call ends its expansion
    try {
        ItemScope scope(*output, &input_.cancel);
        more = open_next_(output->payload);
        if (!more) {
            ended = close_expansion();
            counters.items.fetch_add(1);
        }
    } catch (const Reject& r) {
        // The outputs made before stay; the item is reported, and they are its partial result.
        ended = close_expansion();
        reject(*ended, stage.name, r.reason());
        counters.rejects.fetch_add(1);
    } catch (...) {
        fail(std::current_exception(), stage.name);
        ended = close_expansion();
        drop(*ended);
    }
    counters.busy_ns.fetch_add(now_ns() - start);
    if (ended) {
        unpark();
        if (ended->kind != Msg::Kind::kItem) {
            emit(std::move(ended), ports);  // to be reported at the sink
            return;
        }
        // Its outputs are on their way: the item itself ends here, and its token is free.
        expanded_.fetch_add(1);
        progress_->advance(1);
        inputs_in_flight_.leave();
        source_node_->try_put(ended->token);
        return;
    }
    output->token = free_tokens_.back();
    free_tokens_.pop_back();
    unpark();
    ++next_sub_;
    outputs_.fetch_add(1);
    outputs_in_flight_.enter();
    emit(std::move(output), ports);
}

MsgPtr GraphRun::close_expansion() {
    open_next_ = nullptr;  // frees the expansion's state (a decoder) before the item moves on
    return std::move(open_input_);
}

// The open expansion is abandoned and every item held goes on as dropped (a rejection stays a
// rejection); tokens retire here as they come.
void GraphRun::expand_cancel(OutPort& ports) {
    if (open_next_) {
        MsgPtr input = close_expansion();
        drop(*input);
        unpark();
        emit(std::move(input), ports);
    }
    for (MsgPtr& input : expand_waiting_.take_all()) {
        if (input->kind == Msg::Kind::kItem) drop(*input);
        unpark();
        emit(std::move(input), ports);
    }
    expand_end();
}

// No output can be made any more: the free tokens retire, and so will each one that comes back.
void GraphRun::expand_end() {
    for (int token : free_tokens_) output_retired_.retire(token);  // parked already: active_ stays
    free_tokens_.clear();
}

void GraphRun::emit(MsgPtr msg, OutPort& ports) {
    msg->order = next_order_++;
    std::get<0>(ports).try_put(msg);
}

}  // namespace sf::graph::detail
