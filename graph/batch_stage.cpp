// The batch stage's body: items park in the stage's BatchCutter until a batch is cut, then run
// through the batch function together.
#include <fmt/format.h>

#include "core/error.h"
#include "graph/graph_run.h"

namespace sf::graph::detail {

// In source order, an item waits until every earlier position has passed; rejected or dropped
// items leave holes. An earlier item still on its way holds an active token, so a stall (no
// active token) means the end of input, or tokens held by another parking node: only then does a
// partial batch run.
void GraphRun::batch_body(size_t k, const MsgPtr& msg, OutPort& ports) {
    auto& out = std::get<0>(ports);
    BatchCutter<MsgPtr>& cutter = *cutters_[k];
    Parking parking(*this);
    if (msg->kind == Msg::Kind::kItem && !cancelled()) {
        cutter.add(msg->order, msg);
        parking.add();
    } else if (msg->kind != Msg::Kind::kPoke) {
        if (msg->kind == Msg::Kind::kItem) drop(*msg);
        out.try_put(msg);
        cutter.skip(msg->order);  // its place in the order
    }
    if (cancelled()) {
        for (const MsgPtr& m : cutter.take_all()) {
            unpark();
            drop(*m);
            out.try_put(m);
        }
        return;
    }
    for (std::vector<MsgPtr> batch = cutter.cut(parking.stalled()); !batch.empty();
         batch = cutter.cut(parking.stalled())) {
        run_batch(k, std::move(batch), ports);
    }
}

void GraphRun::run_batch(size_t k, std::vector<MsgPtr> batch, OutPort& ports) {
    const Stage& stage = input_.stages[k];
    StageCounters& counters = counters_[k];
    const auto n = static_cast<int64_t>(batch.size());
    unpark(n);
    std::vector<std::any> inputs;
    inputs.reserve(batch.size());
    for (const MsgPtr& m : batch) inputs.push_back(std::move(m->payload));
    const int64_t start = now_ns();
    try {
        ItemScope scope(*batch.front(), &input_.cancel);
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

}  // namespace sf::graph::detail
