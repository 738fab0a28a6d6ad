// Shared doctest entry point. The GPU test program overrides nothing here: it decides
// per test whether a GPU is present (tests/gpu/gpu_fixture.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

int moeblaze_test_main_hook(int argc, char** argv);  // defined weakly below, GPU tests override

__attribute__((weak)) int moeblaze_test_main_hook(int, char**) { return -1; }

namespace {

// One line per finished test case on stderr (its number, result, seconds, file and name):
// the CPU tests run for minutes, and doctest's console reporter says nothing until the end.
// MOEBLAZE_TEST_PROGRESS=0 turns it off.
struct ProgressListener : doctest::IReporter {
  explicit ProgressListener(const doctest::ContextOptions&) {
    const char* v = std::getenv("MOEBLAZE_TEST_PROGRESS");
    on_ = !(v && std::strcmp(v, "0") == 0);
  }
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& tc) override { current_ = &tc; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& s) override {
    if (!on_ || !current_) return;
    const char* file = current_->m_file.c_str();
    if (const char* slash = std::strrchr(file, '/')) file = slash + 1;
    std::fprintf(stderr, "[%4d] %-4s %7.1f s  %s: %s\n", ++count_, s.testCaseSuccess ? "ok" : "FAIL", s.seconds, file,
                 current_->m_name);
    std::fflush(stderr);
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}

 private:
  bool on_ = true;
  int count_ = 0;
  const doctest::TestCaseData* current_ = nullptr;
};

}  // namespace

REGISTER_LISTENER("moeblaze_progress", 1, ProgressListener);

int main(int argc, char** argv) {
  if (int rc = moeblaze_test_main_hook(argc, argv); rc >= 0) return rc;
  doctest::Context context(argc, argv);
  return context.run();
}
