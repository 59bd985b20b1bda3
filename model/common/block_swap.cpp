#include "model/common/block_swap.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <mutex>
#include <optional>
#include <utility>

#include "core/check.h"
#include "core/error.h"
#include "core/host_memory.h"

namespace sf::model {
namespace {

// One tensor of a block (a parameter or buffer) copied to the device, not yet put in the module.
struct Copy {
    at::Tensor tensor;     // the module's tensor
    at::Tensor host;       // its host data
    at::Tensor host_grad;  // its gradient on the host, undefined while it has none
    at::Tensor data;       // the copies on the device
    at::Tensor grad;
};

// Copies `module`'s tensors (and their gradients) to `device` on the current stream.
std::vector<Copy> copy_to(torch::nn::Module& module, c10::Device device) {
    std::vector<Copy> copies;
    auto add = [&](const at::Tensor& t) {
        Copy c{t, t.data(), t.grad(), {}, {}};
        c.data = c.host.to(device, /*non_blocking=*/true, /*copy=*/true);
        if (c.host_grad.defined()) c.grad = c.host_grad.to(device, /*non_blocking=*/true, true);
        copies.push_back(std::move(c));
    };
    for (const at::Tensor& p : module.parameters()) add(p);
    for (const at::Tensor& b : module.buffers()) add(b);
    return copies;
}

// A module's parameters and buffers on the device for the guard's lifetime, each gradient with
// its parameter; the destructor points them back at their host data and copies the gradients
// (the ones they had, with what this run added) back to the host.
class Lent {
public:
    Lent(std::vector<Copy> copies, bool pinned) : copies_(std::move(copies)), pinned_(pinned) {
        for (Copy& c : copies_) {
            at::Tensor t = c.tensor;
            if (c.host_grad.defined()) t.mutable_grad() = at::Tensor();
            t.set_data(c.data);
            if (c.grad.defined()) t.mutable_grad() = c.grad;
            c.data = c.grad = at::Tensor();  // the module holds them now
        }
    }
    ~Lent() {
        for (Copy& c : copies_) {
            at::Tensor t = c.tensor;
            at::Tensor grad = t.grad();
            if (grad.defined()) t.mutable_grad() = at::Tensor();
            t.set_data(c.host);
            if (!grad.defined()) continue;
            // Into the host gradient it had (the device's began as its copy), else a new one.
            if (c.host_grad.defined() && c.host_grad.sizes() == grad.sizes()) {
                c.host_grad.copy_(grad);
            } else {
                c.host_grad = mem::to_host(grad, pinned_);
            }
            t.mutable_grad() = c.host_grad;
        }
    }
    Lent(const Lent&) = delete;
    Lent& operator=(const Lent&) = delete;

private:
    std::vector<Copy> copies_;
    bool pinned_;
};

// To host memory (mem::to_host: pinned for a CUDA device) or back to the device.
void move_to(torch::nn::Module& m, c10::Device device, bool host, bool pinned) {
    auto move = [&](at::Tensor t) {
        t.set_data(host ? mem::to_host(t.data(), pinned)
                        : t.data().to(device, /*non_blocking=*/false, /*copy=*/true));
    };
    for (at::Tensor p : m.parameters()) move(p);
    for (at::Tensor b : m.buffers()) move(b);
}

}  // namespace

struct BlockSwap::State {
    std::mutex mutex;  // the forward's thread and the backward's (CUDA's autograd thread)
    std::vector<std::shared_ptr<torch::nn::Module>> swapped;
    c10::Device device = c10::Device(c10::kCPU);
    std::optional<c10::Stream> side;  // CUDA: the stream the copies ahead run on
    int64_t copies = 0, copies_ahead = 0;
    std::optional<size_t> last;  // the block lent last
    // The copy made ahead: its block, tensors and (CUDA) the event recorded after it.
    struct Ahead {
        size_t block;
        std::vector<Copy> copies;
        std::optional<c10::Event> done;
    };
    std::optional<Ahead> ahead;

    // Drops the copy made ahead; on CUDA first waits for it, so that the host weights it reads
    // may change (an optimizer step) once this returns.
    void drop_ahead() {
        if (ahead && ahead->done)
            c10::impl::VirtualGuardImpl(device.type()).synchronizeStream(*side);
        ahead.reset();
    }

    // The block's tensors on the device, ready for the current stream: the copy made ahead when
    // it is this block's, else a copy made now.
    std::vector<Copy> take(size_t block) {
        std::vector<Copy> copies_now;
        if (ahead && ahead->block == block) {
            copies_now = std::move(ahead->copies);
            if (ahead->done) {
                // The compute stream waits for the side stream's copy, and the caching allocator
                // learns that the compute stream uses the copies (made on the side stream).
                const c10::impl::VirtualGuardImpl impl(device.type());
                const c10::Stream current = impl.getStream(device);
                ahead->done->block(current);
                for (const Copy& c : copies_now) {
                    impl.recordDataPtrOnStream(c.data.storage().data_ptr(), current);
                    if (c.grad.defined())
                        impl.recordDataPtrOnStream(c.grad.storage().data_ptr(), current);
                }
            }
            ahead.reset();
        } else {
            drop_ahead();
            copies_now = copy_to(*swapped[block], device);
            ++copies;
        }
        return copies_now;
    }

    // Starts the copy of the block expected after `block`: the next one in a forward (the first
    // block of a pass, or one after the block lent last), the previous one in the backward's
    // recomputes (which begin with the block the forward lent last).
    void copy_ahead(size_t block) {
        const bool forward = !last || block > *last;
        last = block;
        if (forward ? block + 1 >= swapped.size() : block == 0) return;
        const size_t next = forward ? block + 1 : block - 1;
        Ahead a{next, {}, {}};
        std::optional<c10::StreamGuard> on_side;
        if (side) on_side.emplace(*side);
        a.copies = copy_to(*swapped[next], device);
        if (side) {
            a.done.emplace(device.type());
            a.done->record(*side);
        }
        ahead = std::move(a);
        ++copies;
        ++copies_ahead;
    }
};

BlockSwap::BlockSwap() : state_(std::make_shared<State>()) {}

void BlockSwap::set(const std::vector<std::shared_ptr<torch::nn::Module>>& blocks, int64_t n,
                    c10::Device device) {
    if (n < 0 || n > static_cast<int64_t>(blocks.size())) {
        throw Error::InvalidArgument(
            fmt::format("--blocks_to_swap {}: the transformer has {} blocks", n, blocks.size()));
    }
    State& s = *state_;
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.drop_ahead();
    s.last.reset();
    for (const auto& block : s.swapped) move_to(*block, s.device, /*host=*/false, false);
    s.swapped.assign(blocks.begin(), blocks.begin() + n);
    s.device = device;
    s.side.reset();
    if (device.is_cuda() && n > 1) {
        const c10::impl::VirtualGuardImpl impl(device.type());
        // "cuda" alone is the current device: the streams and events need its index.
        if (!device.has_index()) s.device = impl.getDevice();
        s.side = impl.getStreamFromGlobalPool(s.device);
    }
    for (const auto& block : s.swapped) move_to(*block, device, /*host=*/true, device.is_cuda());
}

// Unlocked: set() never runs beside a forward pass, the only caller of these two.
int64_t BlockSwap::count() const { return static_cast<int64_t>(state_->swapped.size()); }

bool BlockSwap::swapped(size_t block) const { return block < state_->swapped.size(); }

void BlockSwap::begin_pass() {
    const std::lock_guard<std::mutex> lock(state_->mutex);
    state_->drop_ahead();
    state_->last.reset();
}

CheckpointScope BlockSwap::scope(size_t block) {
    SF_CHECK(swapped(block), "scope() of a block that is not swapped");
    return [state = state_, block] {
        const std::lock_guard<std::mutex> lock(state->mutex);
        std::vector<Copy> copies = state->take(block);
        state->copy_ahead(block);
        return std::shared_ptr<void>(
            std::make_shared<Lent>(std::move(copies), state->device.is_cuda()));
    };
}

int64_t BlockSwap::copies() const {
    const std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->copies;
}

int64_t BlockSwap::copies_ahead() const {
    const std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->copies_ahead;
}

}  // namespace sf::model
