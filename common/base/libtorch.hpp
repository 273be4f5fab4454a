/// @file libtorch.hpp
/// @brief The parts of LibTorch's C++ API this course uses, instead of `<torch/torch.h>`.
///
/// `<torch/torch.h>` also brings the data loaders, the JIT and every `nn` module and functional, and each
/// of them costs every file that includes it: GCC instantiates the templates their inline functions name
/// again at the end of each translation unit, even from a precompiled header. An empty file compiled
/// against a precompiled `<torch/torch.h>` took 5.0 s of CPU on this course's machine; against this
/// header, 2.9 s (`-ftime-report`: "phase lang. deferred"). The build compiles some 60 such units.
///
/// What is here: tensors, factories and autograd (`torch/types.h`), seeds, threads and no-grad guards
/// (`torch/utils.h`), `nn::Module` with the three layers the models use (Linear, Embedding, ModuleList),
/// the functional linear and losses, the three optimizers (SGD, Adam, AdamW), `torch::save`/`load` and
/// the archives, and `torch::cuda`. A file that needs more includes it itself (`<torch/nn/modules/...>`).
#pragma once

#include <torch/types.h>
#include <torch/utils.h>

#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <torch/cuda.h>
#include <torch/serialize.h>
