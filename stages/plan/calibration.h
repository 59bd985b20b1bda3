// The bytes per element of each structural term of memory_model.h, measured on the target
// device: real training steps (step_probe.h) of tiny configurations whose sizes (blocks, width,
// heads, caption width and length, latent grid, micro-batch, chunks) vary independently, so that
// every term moves on its own; per phase, a non-negative least-squares fit of the measured peaks
// (relative error) gives each term's coefficient. A calibration is kept per remedy key
// (PlanRemedies::key) and can be saved as JSON to skip the measuring next time.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "stages/plan/memory_model.h"

namespace sf::plan {

// Tiny steps measured per remedy key. 48 fitted the ablation's rows within 13.3%, 96 the rows
// where 48 did worst (the chunked feed-forward at 1024 px, all remedies at 4096 px) within 2.7%
// (tools/bench/plan_accuracy --points).
constexpr int64_t kCalibrationPoints = 96;

struct Calibration {
    std::string device;  // "cpu", "cuda:0": the device it was measured on
    // key (PlanRemedies::key + the configuration's structure) -> phase -> coefficients
    std::map<std::string, PhaseModels> keys;
    // The worst relative error of the fit over its own points, per key.
    std::map<std::string, double> fit_error;
    // The step time of each point, per key (every key's points have the same shapes).
    std::map<std::string, std::vector<double>> seconds;
    int64_t points = 0;  // per key

    // The median over the points of key's step time over base's: the search's cost.
    double relative_time(const std::string& key, const std::string& base) const;

    std::string to_json() const;
    // kCorruption naming `where` and the bad field.
    static Calibration from_json(const std::string& text, const std::string& where);
};

// The key a calibration of `r` on configurations like `like`'s is kept under: the transformer
// (image or video), its structural switches, LoRA or not, and r.key().
std::string calibration_key(const PlanShape& like, const PlanRemedies& r);

// Measures `points` tiny steps like `r` on configurations like `like`'s (the same transformer
// and structural switches: patch size, position embedding, biases; LoRA when like.lora_rank > 0)
// on `device`, fits each phase and stores the result under calibration_key() in `into`. Progress
// goes to the log.
void calibrate(Calibration& into, const PlanShape& like, const PlanRemedies& r, c10::Device device,
               int64_t points = kCalibrationPoints);

// One phase's model: the highest of two planes (k-plane regression: each point to the plane
// that predicts it higher, each plane refitted on its points, until the split settles; started
// from one split per term, by the term's share of the target), or one plane when that fits as
// well or either side has too few points.
PhaseModel fit_phase(const std::vector<std::vector<double>>& a, const std::vector<double>& b);

// min over c >= 0 of sum_i ((a_i . c - b_i) / b_i)^2 (Lawson-Hanson active set); b_i > 0.
std::vector<double> fit_relative_nonnegative(const std::vector<std::vector<double>>& a,
                                             const std::vector<double>& b);

}  // namespace sf::plan

namespace sf::plan {

// Where calibrations are kept between runs unless a file is named: $XDG_CACHE_HOME/sanaflow/
// (else ~/.cache/sanaflow/) plan-calibration-<device>.json; "" when neither is set.
std::string default_calibration_file(c10::Device device);

// The calibrations a plan needs, measured when first asked for (or again with `recalibrate`),
// read from and saved to `file` when one is given (a file made on another device is ignored).
class CalibrationStore {
public:
    CalibrationStore(c10::Device device, std::string file = "", bool recalibrate = false,
                     int64_t points = kCalibrationPoints);
    // The fitted phases of `r` on configurations like `like`'s.
    PhaseModels phases(const PlanShape& like, const PlanRemedies& r);
    // r's step time over no remedies' on the calibration's points (their median ratio).
    double relative_time(const PlanShape& like, const PlanRemedies& r);
    // Writes the file when something was measured (atomically: a crash leaves the old one).
    void save() const;

private:
    const PhaseModels& measured(const PlanShape& like, const PlanRemedies& r);
    c10::Device device_;
    std::string file_;
    bool recalibrate_;
    int64_t points_;
    Calibration cal_;
    std::set<std::string> fresh_;
};

}  // namespace sf::plan
