// Compiling in child processes.
//
// nvrtcCompileProgram holds a process-wide lock for much of a compile (under gdb a second
// compiling thread waits on NVRTC's mutex inside it): the compile threads of one process keep
// about 1.3 of 2 cores busy and do not scale to 16. Forked children each have their own NVRTC
// state, so a build's kernels compile side by side, one child a kernel.
//
// Only a program that can fork safely opts in (the moeblaze CLI: one thread when it builds).
// A library inside another program (Python, a training job) keeps the compile threads.
#pragma once
#include <cstddef>
#include <exception>
#include <functional>
#include <vector>

#include "nvrtc_compiler.hpp"

namespace moeblaze {

// Whether builds (kernel_build.hpp) compile in forked children: off unless a program turns it
// on. Set it before builds start.
void set_compile_in_processes(bool on);
bool compile_in_processes();

// Children to run at once for a build on this machine: its hardware threads, capped by its
// memory at about 3 GiB a compile (NVRTC's peak on the kernel layer's CuTe kernels).
unsigned default_compile_processes();

// Called in the calling thread, once for each source, in the order the compiles end: the kernel,
// or the exception compiling it threw (a CompileError keeps its log, options and source).
using CompileDone = std::function<void(size_t index, CompiledKernel* kernel, std::exception_ptr error)>;

// Compiles sources[i] with options[i], at most `processes` children at a time (0: the default).
// A child that cannot be started leaves its kernel to this process; a child that dies reports an
// Error naming the kernel and the signal or status. Exceptions from `done` propagate after the
// running children have been waited for.
void compile_forked(const std::vector<const KernelSource*>& sources, const std::vector<CompileOptions>& options,
                    unsigned processes, const CompileDone& done);

}  // namespace moeblaze
