// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// train_mla: a few SGD steps of one MLA layer under Ulysses context parallelism, the smallest complete training loop.
//
//   mpirun -n 4 ./train_mla [--steps N] [--lr X] [--losses FILE]
//
// Each rank holds every weight (the same values on every rank) and S/P tokens of the sequence. The layer learns to
// imitate a fixed random "teacher" MLA layer: loss = 0.5 / (B*S) * sum over all tokens of ||y - y_teacher||^2. Each
// step runs the forward and the overlapped backward, sums the weight gradients over the ranks with MPI_Allreduce (the
// layer gives each rank's partial sums) and updates the weights, identically on every rank. Rank 0 prints the loss of
// each step; it falls, and it is the same for any number of ranks (up to float rounding): the data and the weights do
// not depend on P, only how the sequence is split.
//
// Run with MLACP_TRACE=trace.json to get a Chrome trace per rank (trace.rank0.json, ...) that Perfetto opens.
#include <mpi.h>
#include <Kokkos_Core.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/mla_attention.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <random>
#include <string>
#include <type_traits>

namespace {

using T = float;  // or double
using Space = Kokkos::DefaultExecutionSpace;
using Layer = mlacp::MlaAttention<T, Space>;
using Tensor3 = Layer::tensor3;  // [batch, tokens, hidden], LayoutRight

// Fills a View with uniform values in [-scale, scale] from `seed`: generated on the host, so that every rank (and any
// Kokkos backend) gets the same values.
template <class View>
void fill_uniform(const View& v, std::uint64_t seed, double scale) {
  auto host = Kokkos::create_mirror_view(v);
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<double> uniform(-scale, scale);
  for (std::size_t i = 0; i < host.span(); ++i) host.data()[i] = static_cast<T>(uniform(generator));
  Kokkos::deep_copy(v, host);
}

// Weights with the usual 1/sqrt(fan_in) scale, the RMSNorm gain at 1, biases at 0 (mlacp's parameter table says which
// is which).
Layer::weights_type random_weights(const mlacp::MlaConfig& c, std::uint64_t seed) {
  auto w = Layer::weights_type::allocate(c);
  std::uint64_t index = 0;
  mlacp::for_each_parameter(
      [&](const mlacp::ParameterInfo& info, auto& view) {
        ++index;
        if (!view.data()) return;
        if (info.kind == mlacp::ParameterKind::weight)
          fill_uniform(view, seed + index, 1 / std::sqrt(double(info.shape(c)[1])));
        else if (info.kind == mlacp::ParameterKind::norm_gain)
          Kokkos::deep_copy(view, T(1));
      },
      w);
  return w;
}

// Calls f(weight, gradient) for each parameter the layer has (mlacp's parameter table; biases only when the config
// has them).
template <class F>
void for_each_weight(Layer::weights_type& w, Layer::gradients_type& g, F f) {
  mlacp::for_each_parameter(
      [&](const mlacp::ParameterInfo&, auto& weight, auto& gradient) {
        if (weight.data()) f(weight, gradient);
      },
      w, static_cast<Layer::weights_type&>(g));
}

// The gradient summed over the ranks, in place (through a host copy where the View is in device memory).
template <class View>
void all_reduce_sum(const View& v, MPI_Comm comm) {
  auto host = Kokkos::create_mirror_view(v);  // v itself when it is in host memory
  Kokkos::deep_copy(host, v);
  const MPI_Datatype type = std::is_same_v<T, double> ? MPI_DOUBLE : MPI_FLOAT;
  MPI_Allreduce(MPI_IN_PLACE, host.data(), static_cast<int>(host.span()), type, MPI_SUM, comm);
  Kokkos::deep_copy(v, host);
}

// weight -= lr * gradient
template <class View>
void sgd_update(const View& weight, const View& gradient, T lr) {
  T* w = weight.data();
  const T* g = gradient.data();
  Kokkos::parallel_for(
      "sgd", Kokkos::RangePolicy<Space>(0, weight.span()), KOKKOS_LAMBDA(std::size_t i) { w[i] -= lr * g[i]; });
}

std::string option(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}

void train(int argc, char** argv) {
  const int steps = std::stoi(option(argc, argv, "--steps", "8"));
  const T lr = std::stof(option(argc, argv, "--lr", "0.5"));
  const std::string losses_file = option(argc, argv, "--losses", "");

  mlacp::Mesh mesh(MPI_COMM_WORLD);  // the ranks that share the sequence
  const int rank = mesh.rank(), P = mesh.size();

  // B, S (global), D, H (global), dn, dr, dv, R. S and H must be divisible by the number of ranks.
  mlacp::MlaConfig c{/*batch*/ 2, /*seq*/ 64,   /*hidden*/ 32, /*heads*/ 4, /*nope*/ 8, /*rope*/ 4,
                     /*vdim*/ 8,  /*latent*/ 16};
  auto weights = random_weights(c, 1000);
  Layer student(c, weights, mesh);  // collective: checks the config and the weights on every rank
  Layer teacher(c, random_weights(c, 2000), mesh);
  const int s = student.local_seq();  // S / P tokens on this rank

  // The whole sequence from one seed; this rank takes tokens [rank*s, (rank+1)*s).
  Tensor3 x_all("x_all", c.batch, c.seq, c.hidden),
      x(Kokkos::view_alloc(Kokkos::WithoutInitializing, "x"), c.batch, s, c.hidden);
  fill_uniform(x_all, 3000, 1.0);
  Kokkos::deep_copy(x, Kokkos::subview(x_all, Kokkos::ALL, std::make_pair(rank * s, (rank + 1) * s), Kokkos::ALL));

  // The targets: the teacher's output on this rank's tokens (a forward that needs no gradient).
  const auto inference = mlacp::MlaRequiresGrad::none();
  Tensor3 target("target", c.batch, s, c.hidden);
  {
    auto forward = teacher.forward(Space(), x, inference);
    Kokkos::deep_copy(target, forward.output());
  }

  // The data needs no gradient: the backward skips dx (and its inverse collectives).
  mlacp::MlaRequiresGrad requires_grad;
  requires_grad.x = false;
  Layer::gradients_type grads;  // allocated by the first backward, then reused
  Tensor3 dy("dy", c.batch, s, c.hidden);
  const T inv_tokens = T(1) / T(c.batch * c.seq);
  std::ofstream losses;
  if (rank == 0 && !losses_file.empty()) losses.open(losses_file);

  for (int step = 0; step < steps; ++step) {
    auto forward = student.forward(Space(), x, requires_grad);
    const Tensor3 y = forward.output();

    // Loss and its gradient dy = dloss/dy on this rank's tokens; the loss summed over the ranks.
    double loss = 0;
    Kokkos::parallel_reduce(
        "loss", Kokkos::RangePolicy<Space>(0, y.span()),
        KOKKOS_LAMBDA(std::size_t i, double& sum) {
          const T diff = y.data()[i] - target.data()[i];
          dy.data()[i] = diff * inv_tokens;
          sum += 0.5 * double(diff) * double(diff);
        },
        loss);
    MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    loss *= double(inv_tokens);

    // The overlapped backward accumulates (+=) into grads: zero them first. Then sum over the ranks and step.
    for_each_weight(weights, grads, [](auto&, auto& g) {
      if (g.data()) Kokkos::deep_copy(g, T(0));
    });
    student.backward(Space(), forward, dy, grads);
    Kokkos::fence();
    for_each_weight(weights, grads, [&](auto& w, auto& g) {
      all_reduce_sum(g, MPI_COMM_WORLD);
      sgd_update(w, g, lr);
    });
    Kokkos::fence();

    if (rank == 0) {
      std::printf("step %d loss %.9e\n", step, loss);
      if (losses.is_open()) losses << step << ' ' << std::scientific << std::setprecision(9) << loss << '\n';
    }
  }
  if (rank == 0) std::printf("trained on %d rank(s): %s\n", P, c.describe().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);  // Kokkos lives between MPI_Init and MPI_Finalize
    try {
      train(argc, argv);  // the mesh and the layers are destroyed before Kokkos is finalised
    } catch (const std::exception& e) {
      std::fprintf(stderr, "train_mla: %s\n", e.what());
      status = 1;
    }
  }
  MPI_Finalize();
  return status;
}
