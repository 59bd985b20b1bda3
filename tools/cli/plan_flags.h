// The flags of `sanaflow plan`: the transformer, the shape and the remedies, spelled as train
// spells them, and the budget to search for.
#pragma once

#include <CLI/CLI.hpp>

#include "pipelines/plan.h"

namespace sf::tools {

struct PlanCommand {
    pipelines::PlanOptions options;
    bool checkpointing = false, full_finetune = false;
    int64_t checkpointing_every = 1;
    // --gradient_checkpointing and --full_finetune folded into the options.
    pipelines::PlanOptions resolved() const;
};

void add_plan_flags(CLI::App* cmd, PlanCommand& c);

}  // namespace sf::tools
