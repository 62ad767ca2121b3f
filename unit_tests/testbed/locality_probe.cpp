// locality_probe: a tiny MPI program for the simulated cluster (scripts/netns-cluster.sh) and its locality test
// (test_locality.sh). Plain MPI C API, no mlacp, no gtest.
//
//   locality_probe [--mib M] [--bandwidth] [--latency] A B [A B ...]
//
// Every rank prints "rank R host H" (MPI_Get_processor_name: the node's UTS hostname under the testbed). Then each
// pair (A, B), one pair at a time, exchanges M MiB in each direction (default 64, MPI_Sendrecv of 1 MiB messages)
// while the other ranks wait in a barrier, and rank A prints "pair A B exchanged X MiB each way".
// --bandwidth: instead, A streams M MiB to B (osu_bw-like: windows of 64 non-blocking 1 MiB sends, one ack per
//   window) and A prints "bandwidth A->B MB/s"; --latency: 1000 ping-pongs of 8 bytes, A prints the one-way time.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

namespace {

constexpr int kChunk = 1 << 20;  // 1 MiB per message
constexpr int kWindow = 64;

void exchange(int me, int a, int b, int mib, std::vector<char>& send, std::vector<char>& recv) {
  if (me != a && me != b) return;
  const int peer = me == a ? b : a;
  for (int i = 0; i < mib; ++i) {
    MPI_Sendrecv(send.data(), kChunk, MPI_CHAR, peer, 1, recv.data(), kChunk, MPI_CHAR, peer, 1, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
  }
  if (me == a) std::printf("pair %d %d exchanged %d MiB each way\n", a, b, mib);
}

void bandwidth(int me, int a, int b, int mib, std::vector<char>& buf) {
  if (me != a && me != b) return;
  std::vector<MPI_Request> requests(kWindow);
  char ack = 0;
  // One untimed window to open the connection.
  for (int pass = 0; pass < 2; ++pass) {
    const int total = pass == 0 ? 1 : mib;
    const double t0 = MPI_Wtime();
    for (int done = 0; done < total;) {
      const int n = total - done < kWindow ? total - done : kWindow;
      for (int i = 0; i < n; ++i) {
        if (me == a) {
          MPI_Isend(buf.data() + static_cast<size_t>(i) * kChunk, kChunk, MPI_CHAR, b, 2, MPI_COMM_WORLD, &requests[i]);
        } else {
          MPI_Irecv(buf.data() + static_cast<size_t>(i) * kChunk, kChunk, MPI_CHAR, a, 2, MPI_COMM_WORLD, &requests[i]);
        }
      }
      MPI_Waitall(n, requests.data(), MPI_STATUSES_IGNORE);
      if (me == a) {
        MPI_Recv(&ack, 1, MPI_CHAR, b, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Send(&ack, 1, MPI_CHAR, a, 3, MPI_COMM_WORLD);
      }
      done += n;
    }
    const double dt = MPI_Wtime() - t0;
    if (pass == 1 && me == a) {
      std::printf("bandwidth %d->%d %d MiB in %.3f s: %.1f MB/s (%.3f Gbit/s)\n", a, b, mib, dt,
                  static_cast<double>(mib) * kChunk / dt / 1e6, static_cast<double>(mib) * kChunk * 8 / dt / 1e9);
    }
  }
}

void latency(int me, int a, int b) {
  if (me != a && me != b) return;
  constexpr int kIters = 1000;
  char msg[8] = {};
  double t0 = 0;
  for (int i = -10; i < kIters; ++i) {  // 10 untimed warm-up round trips
    if (i == 0) t0 = MPI_Wtime();
    if (me == a) {
      MPI_Send(msg, 8, MPI_CHAR, b, 4, MPI_COMM_WORLD);
      MPI_Recv(msg, 8, MPI_CHAR, b, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(msg, 8, MPI_CHAR, a, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(msg, 8, MPI_CHAR, a, 4, MPI_COMM_WORLD);
    }
  }
  if (me == a) std::printf("latency %d<->%d 8 B one-way %.1f us\n", a, b, (MPI_Wtime() - t0) / kIters / 2 * 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int me = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  int mib = 64;
  bool bw = false, lat = false;
  std::vector<std::pair<int, int>> pairs;
  std::vector<int> ranks;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
      mib = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--bandwidth") == 0) {
      bw = true;
    } else if (std::strcmp(argv[i], "--latency") == 0) {
      lat = true;
    } else {
      ranks.push_back(std::atoi(argv[i]));
    }
  }
  bool bad = mib <= 0 || ranks.empty() || ranks.size() % 2 != 0;
  for (size_t i = 0; !bad && i < ranks.size(); i += 2) {
    const int a = ranks[i], b = ranks[i + 1];
    if (a < 0 || b < 0 || a >= size || b >= size || a == b) bad = true;
    pairs.emplace_back(a, b);
  }
  if (bad) {
    if (me == 0) {
      std::fprintf(stderr, "usage: locality_probe [--mib M] [--bandwidth] [--latency] A B [A B ...] (ranks < %d)\n",
                   size);
    }
    MPI_Finalize();
    return 2;
  }

  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::printf("rank %d host %s\n", me, name);
  std::fflush(stdout);

  std::vector<char> send(static_cast<size_t>(bw ? kWindow : 1) * kChunk, static_cast<char>(me));
  std::vector<char> recv(kChunk);
  for (const auto& [a, b] : pairs) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (lat) latency(me, a, b);
    if (bw) {
      bandwidth(me, a, b, mib, send);
    } else if (!lat) {
      exchange(me, a, b, mib, send, recv);
    }
    std::fflush(stdout);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
