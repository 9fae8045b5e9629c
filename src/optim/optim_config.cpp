// Config parsing of the `optim:` and `sched:` sections, with range checks whose errors name the
// key (ConfigNode::fail). Keys that the chosen optimizer or schedule ignores are rejected.
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace ska::optim {

namespace {

// Fails when `key` is set although only `users` read it.
void reject_unused(const ConfigNode& node, const std::string& key, const std::string& chosen,
                   const std::string& users) {
  if (node.has(key)) node.fail(key, "is not used by '" + chosen + "' (only by " + users + ")");
}

std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

double get_positive(const ConfigNode& node, const std::string& key, double fallback) {
  const double value = node.get<double>(key, fallback);
  if (!(value > 0)) node.fail(key, "value " + number(value) + " must be > 0");
  return value;
}

}  // namespace

OptimizerOptions OptimizerOptions::from_config(const ConfigNode& node) {
  OptimizerOptions o;
  o.name = node.get_choice("name", o.name, {"adam", "adamw", "lamb", "sgd"});
  o.lr = get_positive(node, "lr", o.lr);
  o.weight_decay = node.get_double_in("weight_decay", 0.0, 0.0, 1.0);
  o.no_weight_decay = node.get<std::vector<std::string>>("no_weight_decay", {});
  const bool adam_family = o.name != "sgd";
  if (adam_family) {
    const std::vector<double> betas = node.get<std::vector<double>>("betas", {o.beta1, o.beta2});
    if (betas.size() != 2) node.fail("betas", "expected two numbers [beta1, beta2]");
    for (double beta : betas) {
      if (!(beta >= 0 && beta < 1)) {
        node.fail("betas", "value " + number(beta) + " is out of range; expected [0, 1)");
      }
    }
    o.beta1 = betas[0], o.beta2 = betas[1];
    o.eps = get_positive(node, "eps", o.name == "lamb" ? 1e-6 : 1e-8);
    reject_unused(node, "momentum", o.name, "sgd");
    reject_unused(node, "nesterov", o.name, "sgd");
  } else {
    o.momentum = node.get<double>("momentum", o.momentum);
    if (!(o.momentum >= 0 && o.momentum < 1)) {
      node.fail("momentum", "value " + number(o.momentum) + " is out of range; expected [0, 1)");
    }
    o.nesterov = node.get<bool>("nesterov", false);
    if (o.nesterov && o.momentum == 0) node.fail("nesterov", "needs momentum > 0");
    reject_unused(node, "betas", o.name, "adam, adamw, lamb");
    reject_unused(node, "eps", o.name, "adam, adamw, lamb");
  }
  if (o.name == "lamb") {
    o.max_grad_norm = node.get_double_in("max_grad_norm", 1.0, 0.0, 1e30);
    o.always_adapt = node.get<bool>("always_adapt", false);
    o.trust_clip = node.get<bool>("trust_clip", false);
  } else {
    for (const char* key : {"max_grad_norm", "always_adapt", "trust_clip"}) {
      reject_unused(node, key, o.name, "lamb");
    }
  }
  return o;
}

ScheduleOptions ScheduleOptions::from_config(const ConfigNode& node, double base_lr,
                                             int64_t epochs) {
  ScheduleOptions o;
  o.base_lr = base_lr;
  o.epochs = epochs;
  o.name = node.get_choice("name", o.name, {"constant", "cosine", "step"});
  o.warmup_epochs = node.get_int_in("warmup_epochs", 0, 0, epochs);
  o.warmup_lr = node.get_double_in("warmup_lr", 0.0, 0.0, 1e30);
  o.per_step = node.get<bool>("per_step", false);
  if (o.name == "cosine") {
    o.min_lr = node.get_double_in("min_lr", 0.0, 0.0, base_lr);
    o.cooldown_epochs = node.get_int_in("cooldown_epochs", 0, 0, 1 << 20);
  } else {
    reject_unused(node, "min_lr", o.name, "cosine");
    reject_unused(node, "cooldown_epochs", o.name, "cosine");
  }
  if (o.name == "step") {
    o.step_size = node.get_int_in("step_size", o.step_size, 1, 1 << 20);
    o.gamma = node.get_double_in("gamma", o.gamma, 0.0, 1.0);
  } else {
    reject_unused(node, "step_size", o.name, "step");
    reject_unused(node, "gamma", o.name, "step");
  }
  return o;
}

}  // namespace ska::optim
