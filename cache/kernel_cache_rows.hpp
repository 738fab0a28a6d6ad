// Rows read from a file that is not trusted (an import, or a damaged cache being salvaged):
// reading them table by table without letting the file run anything, and checking each row
// before it may enter a cache. Internal to cache/; the contract is in kernel_cache.hpp.
#pragma once
#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/kernel_cache_sqlite.hpp"

namespace moeblaze::cache_detail {

// One column value as SQLite stored it (storage class and contents).
struct Value {
  int type = SQLITE_NULL;  // SQLITE_INTEGER, SQLITE_FLOAT, SQLITE_TEXT, SQLITE_BLOB, SQLITE_NULL
  int64_t integer = 0;
  double real = 0;
  std::string bytes;  // TEXT and BLOB
};
using Row = std::vector<Value>;

enum class CacheTable { binaries, measurements, winners };
const char* table_name(CacheTable t);
const char* table_columns(CacheTable t);  // kBinaryColumns, ... (the order of a Row)
size_t column_count(CacheTable t);

// Why `table` of `src` cannot be read as a cache table (empty when it can): it must be a real
// table (not a view, a virtual table or missing) that has every expected column, none of them
// generated.
std::string source_table_problem(Connection& src, CacheTable table);

// Why `row` may not enter a cache (empty when it may): "<column>: <problem>", from a small
// fixed set of problems so that counts per reason stay readable.
std::string row_problem(CacheTable table, const Row& row, const TuningRowCheck& check, const ImportLimits& limits);

// Walks the rows of one table of `src` in rowid order. With tolerate_damage a row that cannot
// be read is counted and skipped, and a damaged page of the table's tree is stepped over
// (searching for the first id after it that can be read); without, a read error throws. A
// value over the byte limit is skipped either way (SQLITE_TOOBIG).
class RowWalker {
 public:
  RowWalker(Connection& src, CacheTable table, bool tolerate_damage, int64_t max_value_bytes);
  enum class Step { row, skipped, end };
  Step next(Row& row);  // skipped: a row could not be read (unreadable() / too_big() tell which)
  int64_t unreadable() const { return unreadable_; }
  int64_t too_big() const { return too_big_; }
  int64_t damaged_ranges() const { return damaged_ranges_; }

 private:
  using Stmt = std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)>;
  Stmt prepare(const std::string& sql);
  Step after_error(int rc);  // where to go on after a failed step
  // The first rowid > after (an inner nullopt: there is none); nullopt: that part of the tree
  // cannot be read.
  std::optional<std::optional<int64_t>> probe(int64_t after);
  void restart();

  Connection& src_;
  CacheTable table_;
  bool tolerate_;
  bool by_rowid_ = true;
  bool started_ = false;
  int64_t cursor_ = INT64_MIN;  // rows with rowid <= cursor_ are done
  int64_t unreadable_ = 0, too_big_ = 0, damaged_ranges_ = 0;
  Stmt rows_{nullptr, sqlite3_finalize};
};

}  // namespace moeblaze::cache_detail
