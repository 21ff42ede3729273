// Runs msr-fiddle/piper's own algo.cpp (Tarnawski et al., NeurIPS 2021) on one instance file
// written by `graphpipe piper-export`, and prints its result as one JSON line: the bottleneck
// time per micro-batch ("tps", in the instance's time unit), the stages (nodes, data-parallel
// degree) and the DP's CPU time. Piper's code is not part of this repository: scripts/real_piper.sh
// compiles this file with -I <piper checkout>, and its main() is renamed so that this one runs.
// Build: g++ -O3 -std=c++17 -I PIPER_DIR scripts/piper_driver.cpp -o piper_driver
#define main piper_paper_main
#include "algo.cpp"
#undef main

int main(int argc, char** argv) {
  if (argc != 2) {
    cerr << "usage: piper_driver INSTANCE.json" << endl;
    return 2;
  }
  ifstream in(argv[1]);
  if (!in) {
    cerr << "piper_driver: cannot read " << argv[1] << endl;
    return 2;
  }
  json j;
  in >> j;
  Instance ins = j.get<Instance>();
  const clock_t start = clock();
  Graph g(ins);
  Result r = g.runDP();
  const double cpu_s = (clock() - start) * 1.0 / CLOCKS_PER_SEC;
  json out;
  out["cpu_s"] = cpu_s;
  out["downsets"] = g.ideals.size();
  if (r.stages.empty()) {
    out["feasible"] = false;
  } else {
    out["feasible"] = true;
    out["tps"] = g.getTPSForResult(r);
    g.renumberResultBack(r);
    json stages = json::array();
    for (const ResultStage& s : r.stages)
      stages.push_back({{"nodes", s.nodes}, {"dp", s.dataParallelDegree}, {"tp", s.tensorParallelDegree}});
    out["stages"] = stages;
  }
  cout << out.dump() << endl;
  return 0;
}
