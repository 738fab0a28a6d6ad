// Compiling in forked children (runtime/compile_processes.hpp): the same binaries and reports as a
// compile in this process, a compile error with its log, a `done` that throws, a build that
// stores and counts its children's kernels, and no child left unwaited.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <stdexcept>
#include <vector>

#include "cache_test_util.hpp"
#include "index_build_specs.hpp"
#include "core/errors.hpp"
#include "core/parallel.hpp"
#include "generator/heuristics.hpp"
#include "generator/kernel_spec.hpp"
#include "runtime/compile_processes.hpp"
#include "runtime/kernel_build.hpp"

using namespace moeblaze;

namespace {

using test_util::index_build_specs;

// Every child of this process has been waited for.
bool no_children_left() { return ::waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD; }

// Restores the process's setting however a test case ends.
struct InProcesses {
  explicit InProcesses(bool on) : was(compile_in_processes()) { set_compile_in_processes(on); }
  ~InProcesses() { set_compile_in_processes(was); }
  bool was;
};

}  // namespace

TEST_CASE("compile processes: children give the binaries and reports of a compile in this process") {
  const auto specs = index_build_specs();
  std::vector<GeneratedKernel> generated;
  std::vector<const KernelSource*> sources;
  std::vector<CompileOptions> options;
  for (const KernelSpec& s : specs) generated.push_back(generate(s));
  for (const GeneratedKernel& g : generated) {
    sources.push_back(&g.source);
    options.push_back(CompileOptions{Arch::sm_90a, {}, true});
  }
  std::vector<CompiledKernel> forked(sources.size());
  std::set<size_t> seen;
  compile_forked(sources, options, 2, [&](size_t i, CompiledKernel* k, std::exception_ptr error) {
    REQUIRE_FALSE(error);
    REQUIRE(k != nullptr);
    CHECK(seen.insert(i).second);
    forked[i] = *k;
  });
  CHECK(seen.size() == sources.size());
  CHECK(no_children_left());
  for (size_t i = 0; i < sources.size(); ++i) {
    const CompiledKernel here = compile_kernel(*sources[i], options[i]);
    CAPTURE(here.kernel_name);
    CHECK(forked[i].kernel_name == here.kernel_name);
    CHECK(forked[i].arch == here.arch);
    CHECK_FALSE(forked[i].cubin.empty());
    CHECK(forked[i].cubin == here.cubin);
    CHECK(forked[i].ptx == here.ptx);
    CHECK(forked[i].options == here.options);
    CHECK(forked[i].resources.registers == here.resources.registers);
    CHECK(forked[i].resources.code_bytes == here.resources.code_bytes);
    CHECK(forked[i].compile_ms > 0);
  }
}

TEST_CASE("compile processes: a child's compile error comes back as a CompileError with its log and source") {
  KernelSource bad;
  bad.kernel_name = "mb_not_a_kernel";
  bad.file_name = "mb_not_a_kernel.cu";
  bad.text = "extern \"C\" __global__ void mb_not_a_kernel() { this is not C++; }\n";
  const KernelSource good = generate(index_build_specs().front()).source;
  std::vector<std::exception_ptr> errors(2);
  std::vector<bool> compiled(2, false);
  compile_forked({&bad, &good}, {CompileOptions{}, CompileOptions{}}, 2,
                 [&](size_t i, CompiledKernel* k, std::exception_ptr error) {
                   errors[i] = error;
                   compiled[i] = k != nullptr;
                 });
  CHECK(compiled[1]);
  CHECK_FALSE(errors[1]);
  REQUIRE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const CompileError& e) {
    CHECK(e.kernel_name == "mb_not_a_kernel");
    CHECK(e.source == bad.text);
    CHECK(e.log.find("error") != std::string::npos);
    CHECK(std::string(e.what()).find("mb_not_a_kernel") != std::string::npos);
    CHECK_FALSE(e.options.empty());
  }
  CHECK(no_children_left());
}

TEST_CASE("compile processes: a done that throws stops the build, and every child is waited for") {
  const auto specs = index_build_specs();
  std::vector<GeneratedKernel> generated;
  std::vector<const KernelSource*> sources;
  for (const KernelSpec& s : specs) generated.push_back(generate(s));
  for (const GeneratedKernel& g : generated) sources.push_back(&g.source);
  int calls = 0;
  CHECK_THROWS_WITH_AS(compile_forked(sources, std::vector<CompileOptions>(sources.size()), 2,
                                      [&](size_t, CompiledKernel*, std::exception_ptr) {
                                        ++calls;
                                        throw std::runtime_error("the caller gave up");
                                      }),
                       "the caller gave up", std::runtime_error);
  CHECK(calls == 1);
  CHECK(no_children_left());
  CHECK_THROWS_AS(compile_forked(sources, {}, 2, [](size_t, CompiledKernel*, std::exception_ptr) {}), InvalidArgument);
}

TEST_CASE("compile processes: a build in children stores, counts and reports its kernels as one in threads") {
  InProcesses on(true);
  cache_test::TempDir dir;
  KernelCache cache(dir.file("k.db"));
  const auto specs = index_build_specs();
  int progress_calls = 0;
  BuildOptions o{&cache};
  o.progress = [&](const BuildProgress&) { ++progress_calls; };
  BuildCounts counts;
  const std::vector<KernelBuild> builds = build_kernels(specs, o, &counts);
  CHECK(counts.compiled == 3);
  CHECK(counts.failed == 0);
  CHECK(progress_calls == 4);
  CHECK(no_children_left());
  set_compile_in_processes(false);
  const std::vector<BuiltKernel> threads = compile_all(specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    REQUIRE(builds[i].kernel);
    CHECK(builds[i].kernel->compiled.cubin == threads[i].compiled.cubin);
  }
  BuildCounts again;
  build_kernels(specs, o, &again);
  CHECK(again.from_cache == 3);  // the children's kernels were stored
}

TEST_CASE("compile processes: the default count is at least one and at most the hardware's threads") {
  CHECK(default_compile_processes() >= 1);
  CHECK(default_compile_processes() <= std::max(1u, hardware_threads()));
}
