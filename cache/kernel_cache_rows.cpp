// Reading and checking rows of untrusted cache files (kernel_cache_rows.hpp).
#include "cache/kernel_cache_rows.hpp"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <string_view>

namespace moeblaze::cache_detail {
namespace {

// What a column may hold.
enum class Kind {
  hex16,      // 16 lowercase hex digits (a key hash or checksum)
  ident,      // [A-Za-z0-9_.]+ (family, kernel name, NVRTC version)
  text,       // printable ASCII, non-empty (keys, shapes, device names, tiles)
  long_text,  // NVRTC log or failure detail: printable, line breaks, tabs, UTF-8 without C1 controls
  cubin,      // a blob holding an ELF file
  integer,    // an INTEGER in [lo, hi]
  time,       // unix seconds: finite, in [0, 1e11]
  ms,         // a time in ms: finite, in [0, 1e9]
  ms_or_null, // the same, or NULL (SQLite stores NaN as NULL)
  bucket,     // a power of two in [1, 2^31]
  status,     // a measurement status
};

struct Column {
  const char* name;
  Kind kind;
  int64_t lo = 0, hi = 0;
};

constexpr std::array kBinaryColumnKinds = {
    Column{"key_hash", Kind::hex16},   Column{"key", Kind::text},          Column{"kernel_name", Kind::ident},
    Column{"arch", Kind::ident},       Column{"nvrtc_version", Kind::ident}, Column{"cubin", Kind::cubin},
    Column{"checksum", Kind::hex16},   Column{"registers", Kind::integer, 0, 255},
    Column{"spill_bytes", Kind::integer, 0, int64_t{1} << 30}, Column{"static_smem", Kind::integer, 0, 1 << 20},
    Column{"dynamic_smem", Kind::integer, 0, 1 << 20}, Column{"threads", Kind::integer, 1, 1024},
    Column{"log", Kind::long_text},    Column{"created", Kind::time},      Column{"last_used", Kind::time}};
constexpr std::array kMeasurementColumnKinds = {
    Column{"key_hash", Kind::hex16}, Column{"key_text", Kind::text}, Column{"family", Kind::ident},
    Column{"template_hash", Kind::hex16}, Column{"shape", Kind::text}, Column{"token_bucket", Kind::bucket},
    Column{"device", Kind::text}, Column{"policy", Kind::text}, Column{"config", Kind::text},
    Column{"status", Kind::status}, Column{"median_ms", Kind::ms_or_null}, Column{"spread_ms", Kind::ms_or_null},
    Column{"samples", Kind::integer, 0, 1'000'000'000}, Column{"detail", Kind::long_text},
    Column{"created", Kind::time}};
constexpr std::array kWinnerColumnKinds = {
    Column{"key_hash", Kind::hex16}, Column{"key_text", Kind::text}, Column{"family", Kind::ident},
    Column{"template_hash", Kind::hex16}, Column{"shape", Kind::text}, Column{"token_bucket", Kind::bucket},
    Column{"device", Kind::text}, Column{"policy", Kind::text}, Column{"config", Kind::text},
    Column{"median_ms", Kind::ms}, Column{"spread_ms", Kind::ms_or_null}, Column{"default_ms", Kind::ms_or_null},
    Column{"created", Kind::time}};

struct ColumnList {
  const Column* begin;
  size_t size;
};
ColumnList columns_of(CacheTable t) {
  switch (t) {
    case CacheTable::binaries: return {kBinaryColumnKinds.data(), kBinaryColumnKinds.size()};
    case CacheTable::measurements: return {kMeasurementColumnKinds.data(), kMeasurementColumnKinds.size()};
    case CacheTable::winners: return {kWinnerColumnKinds.data(), kWinnerColumnKinds.size()};
  }
  return {nullptr, 0};
}

bool is_hex16(const std::string& s) {
  return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}
bool is_ident(const std::string& s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!std::isalnum(c) && c != '_' && c != '.') return false;
  return true;
}
bool is_printable_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}
// Line breaks and tabs, printable ASCII, and well-formed UTF-8 that encodes no C1 control
// (U+0080..U+009F: some terminals act on them as they do on ESC).
bool is_long_text(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n' || c == '\t' || c == '\r' || (c >= 0x20 && c < 0x7f)) {
      ++i;
      continue;
    }
    size_t extra = 0;
    uint32_t cp = 0;
    if (c >= 0xc2 && c <= 0xdf) extra = 1, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) extra = 2, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) extra = 3, cp = c & 0x07;
    else return false;
    if (i + extra >= s.size()) return false;
    for (size_t k = 1; k <= extra; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    const uint32_t smallest[] = {0, 0x80, 0x800, 0x10000};  // shorter encodings are not allowed
    if (cp < smallest[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp <= 0x9f))
      return false;
    i += extra + 1;
  }
  return true;
}

bool is_number(const Value& v) { return v.type == SQLITE_FLOAT || v.type == SQLITE_INTEGER; }
double number(const Value& v) { return v.type == SQLITE_FLOAT ? v.real : static_cast<double>(v.integer); }

// The problem with one value, or "" when it fits its column.
std::string value_problem(const Column& c, const Value& v, const ImportLimits& limits) {
  switch (c.kind) {
    case Kind::hex16:
    case Kind::ident:
    case Kind::text:
      if (v.type != SQLITE_TEXT) return "wrong type";
      if (int64_t(v.bytes.size()) > limits.max_text_bytes) return "too long";
      if (!is_printable_ascii(v.bytes)) return "control or non-ASCII character";
      if (v.bytes.empty()) return "empty";
      if (c.kind == Kind::hex16 && !is_hex16(v.bytes)) return "not 16 hex digits";
      if (c.kind == Kind::ident && !is_ident(v.bytes)) return "not a name";
      return "";
    case Kind::long_text:
      if (v.type != SQLITE_TEXT) return "wrong type";
      if (int64_t(v.bytes.size()) > limits.max_log_bytes) return "too long";
      if (!is_long_text(v.bytes)) return "control character or bad UTF-8";
      return "";
    case Kind::cubin:
      if (v.type != SQLITE_BLOB) return "wrong type";
      if (int64_t(v.bytes.size()) > limits.max_blob_bytes) return "too large";
      if (v.bytes.size() < 4 || std::memcmp(v.bytes.data(), "\x7f" "ELF", 4) != 0) return "not an ELF cubin";
      return "";
    case Kind::integer:
      if (v.type != SQLITE_INTEGER) return "wrong type";
      if (v.integer < c.lo || v.integer > c.hi) return "out of range";
      return "";
    case Kind::bucket:
      if (v.type != SQLITE_INTEGER) return "wrong type";
      if (v.integer < 1 || v.integer > (int64_t{1} << 31) || (v.integer & (v.integer - 1))) return "not a power of two in [1, 2^31]";
      return "";
    case Kind::time:
    case Kind::ms:
    case Kind::ms_or_null: {
      if (v.type == SQLITE_NULL) return c.kind == Kind::ms_or_null ? "" : "missing";
      if (!is_number(v)) return "wrong type";
      const double x = number(v);
      if (!std::isfinite(x)) return "not finite";
      if (x < 0 || x > (c.kind == Kind::time ? 1e11 : 1e9)) return "out of range";
      return "";
    }
    case Kind::status:
      if (v.type != SQLITE_TEXT) return "wrong type";
      for (const char* s : {"ok", "illegal", "compile_failed", "run_failed", "wrong_result"})
        if (v.bytes == s) return "";
      return "unknown status";
  }
  return "unknown column";
}

// Rows of measurements and winners carry their tuning key twice: as fields and as text (with
// its hash). Both must agree, or lookups would find a row under one key that says another.
std::string tuning_key_problem(const Row& r) {
  TuningKey k;
  k.family = r[2].bytes;
  k.template_hash = r[3].bytes;
  k.shape = r[4].bytes;
  k.token_bucket = r[5].integer;
  k.device = r[6].bytes;
  k.policy = r[7].bytes;
  if (r[1].bytes != k.text()) return "key_text: does not match the key fields";
  if (r[0].bytes != key_hash(r[1].bytes)) return "key_hash: does not match key_text";
  return "";
}

Value read_value(sqlite3_stmt* s, int col) {
  Value v;
  v.type = sqlite3_column_type(s, col);
  switch (v.type) {
    case SQLITE_INTEGER: v.integer = sqlite3_column_int64(s, col); break;
    case SQLITE_FLOAT: v.real = sqlite3_column_double(s, col); break;
    case SQLITE_TEXT: {
      const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(s, col));
      v.bytes.assign(t ? t : "", size_t(sqlite3_column_bytes(s, col)));
      break;
    }
    case SQLITE_BLOB: {
      const auto* b = static_cast<const char*>(sqlite3_column_blob(s, col));
      v.bytes.assign(b ? b : "", b ? size_t(sqlite3_column_bytes(s, col)) : 0);
      break;
    }
    default: break;
  }
  return v;
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

}  // namespace

const char* table_name(CacheTable t) {
  switch (t) {
    case CacheTable::binaries: return "binaries";
    case CacheTable::measurements: return "measurements";
    case CacheTable::winners: return "winners";
  }
  return "";
}

const char* table_columns(CacheTable t) {
  switch (t) {
    case CacheTable::binaries: return kBinaryColumns;
    case CacheTable::measurements: return kMeasurementColumns;
    case CacheTable::winners: return kWinnerColumns;
  }
  return "";
}

size_t column_count(CacheTable t) { return columns_of(t).size; }

std::string source_table_problem(Connection& src, CacheTable table) {
  const std::string name = table_name(table);
  try {
    std::string type, sql;
    int found = 0;
    {
      Statement s(src, "SELECT type, coalesce(sql, '') FROM sqlite_master WHERE name = ? COLLATE NOCASE",
                  "reading the schema");
      s.bind_text(1, name);
      while (s.step()) {
        ++found;
        type = s.text(0);
        sql = s.text(1);
      }
    }
    if (found == 0) return fmt::format("has no table {}", name);
    if (found > 1) return fmt::format("has {} objects named {}", found, name);
    if (type != "table") return fmt::format("{} is a {}, not a table", name, type);
    // A virtual table is listed as a table too; only a plain CREATE TABLE holds plain rows.
    const size_t first = sql.find_first_not_of(" \t\r\n");
    if (first == std::string::npos || !equals_ignoring_case(std::string_view(sql).substr(first, 12), "CREATE TABLE"))
      return fmt::format("{} is not a plain table", name);
    // table_xinfo lists hidden columns too: hidden 2 or 3 is a generated column (computed when
    // read), which an export never has.
    std::vector<std::pair<std::string, int64_t>> columns;
    {
      Statement s(src, fmt::format("SELECT name, hidden FROM pragma_table_xinfo('{}')", name), "reading the schema");
      while (s.step()) columns.emplace_back(s.text(0), s.integer(1));
    }
    const ColumnList want = columns_of(table);
    for (size_t i = 0; i < want.size; ++i) {
      const Column& c = want.begin[i];
      bool ok = false;
      for (const auto& [col, hidden] : columns)
        if (equals_ignoring_case(col, c.name)) {
          if (hidden != 0) return fmt::format("{}.{} is a generated or hidden column", name, c.name);
          ok = true;
        }
      if (!ok) return fmt::format("{} has no column {}", name, c.name);
    }
  } catch (const SqliteError& e) {
    return fmt::format("{} cannot be read ({})", name, sqlite3_errstr(e.extended_code));
  }
  return "";
}

std::string row_problem(CacheTable table, const Row& row, const TuningRowCheck& check, const ImportLimits& limits) {
  const ColumnList cols = columns_of(table);
  if (row.size() != cols.size) return "row: wrong number of columns";
  for (size_t i = 0; i < cols.size; ++i)
    if (std::string p = value_problem(cols.begin[i], row[i], limits); !p.empty())
      return fmt::format("{}: {}", cols.begin[i].name, p);
  if (table == CacheTable::binaries) {
    if (row[0].bytes != key_hash(row[1].bytes)) return "key_hash: does not match the key";
    if (row[6].bytes != checksum(std::vector<char>(row[5].bytes.begin(), row[5].bytes.end())))
      return "checksum: does not match the cubin";
    if (row[2].bytes.rfind("mb_", 0) != 0) return "kernel_name: not a moeblaze kernel";
    if (row[3].bytes.rfind("sm_", 0) != 0) return "arch: not an sm_ target";
    return "";
  }
  if (std::string p = tuning_key_problem(row); !p.empty()) return p;
  if (table == CacheTable::measurements && row[9].bytes == "ok" && row[10].type == SQLITE_NULL)
    return "median_ms: missing for an ok measurement";
  if (check)
    if (std::string p = check(row[2].bytes, row[8].bytes); !p.empty()) return "config: " + p;
  return "";
}

RowWalker::RowWalker(Connection& src, CacheTable table, bool tolerate_damage, int64_t max_value_bytes)
    : src_(src), table_(table), tolerate_(tolerate_damage) {
  // A value beyond the limit fails its step with SQLITE_TOOBIG instead of being read.
  sqlite3_limit(src.get(), SQLITE_LIMIT_LENGTH, int(std::min<int64_t>(max_value_bytes, 1'000'000'000)));
  // Walking by rowid needs the real rowid: a table without one, or with a column that hides
  // it, is read in one plain scan.
  const std::string name = table_name(table);
  bool hidden_rowid = false;
  try {
    Statement s(src, fmt::format("SELECT name FROM pragma_table_xinfo('{}')", name), "reading the schema");
    while (s.step())
      for (const char* alias : {"rowid", "_rowid_", "oid"}) hidden_rowid |= equals_ignoring_case(s.text(0), alias);
  } catch (const SqliteError&) {
    hidden_rowid = true;
  }
  by_rowid_ = !hidden_rowid;
  if (by_rowid_) {
    sqlite3_stmt* s = nullptr;
    const std::string sql = fmt::format("SELECT rowid FROM {} LIMIT 0", name);
    if (sqlite3_prepare_v2(src.get(), sql.c_str(), -1, &s, nullptr) != SQLITE_OK) by_rowid_ = false;  // WITHOUT ROWID
    sqlite3_finalize(s);
  }
}

RowWalker::Stmt RowWalker::prepare(const std::string& sql) {
  sqlite3_stmt* s = nullptr;
  if (const int rc = sqlite3_prepare_v2(src_.get(), sql.c_str(), -1, &s, nullptr); rc != SQLITE_OK) {
    sqlite3_finalize(s);
    src_.fail(rc, fmt::format("reading table {}", table_name(table_)));
  }
  return Stmt(s, sqlite3_finalize);
}

void RowWalker::restart() {
  const std::string name = table_name(table_), cols = table_columns(table_);
  if (by_rowid_) {
    // ">= cursor + 1", not "> cursor": SQLite seeks to the key itself first, and the key just
    // before a damaged page sits in that page's parent range.
    rows_ = prepare(fmt::format("SELECT rowid, {} FROM {} WHERE rowid >= ?1 ORDER BY rowid", cols, name));
    sqlite3_bind_int64(rows_.get(), 1, cursor_ + 1);
  } else {
    rows_ = prepare(fmt::format("SELECT NULL, {} FROM {}", cols, name));
  }
  started_ = true;
}

std::optional<std::optional<int64_t>> RowWalker::probe(int64_t after) {
  if (after == INT64_MAX) return std::optional<int64_t>();
  Stmt s = prepare(fmt::format("SELECT rowid FROM {} WHERE rowid >= ?1 ORDER BY rowid LIMIT 1", table_name(table_)));
  sqlite3_bind_int64(s.get(), 1, after + 1);
  const int rc = sqlite3_step(s.get());
  if (rc == SQLITE_ROW) return std::optional<int64_t>(sqlite3_column_int64(s.get(), 0));
  if (rc == SQLITE_DONE) return std::optional<int64_t>();
  return std::nullopt;
}

RowWalker::Step RowWalker::after_error(int rc) {
  const int primary = rc & 0xff;
  const bool too_big = primary == SQLITE_TOOBIG;
  if (!by_rowid_ || (!tolerate_ && !too_big)) src_.fail(rc, fmt::format("reading table {}", table_name(table_)));
  rows_.reset();
  // Is it one row (its record or overflow pages) or the tree around it?
  if (auto next = probe(cursor_)) {
    if (!*next) return Step::end;
    cursor_ = **next;  // that row is lost; the walk goes on after it
    ++(too_big ? too_big_ : unreadable_);
    return Step::skipped;
  }
  // The tree cannot be read past cursor_: find the smallest start after it from which the next
  // rowid can be read again, doubling the step and then halving back.
  ++damaged_ranges_;
  auto start_at = [&](unsigned __int128 offset) {
    const __int128 x = static_cast<__int128>(cursor_) + static_cast<__int128>(offset);
    return x > INT64_MAX ? INT64_MAX : static_cast<int64_t>(x);
  };
  unsigned __int128 bad = 0, good = 1;
  while (!probe(start_at(good))) {
    if (start_at(good) == INT64_MAX) return Step::end;  // nothing readable after the damage
    bad = good;
    good *= 2;
  }
  while (good - bad > 1) {
    const unsigned __int128 mid = bad + (good - bad) / 2;
    (probe(start_at(mid)) ? good : bad) = mid;
  }
  cursor_ = start_at(good);
  return Step::skipped;
}

RowWalker::Step RowWalker::next(Row& row) {
  if (by_rowid_ && cursor_ == INT64_MAX) return Step::end;
  if (!started_) restart();
  for (;;) {
    if (!rows_) restart();
    const int rc = sqlite3_step(rows_.get());
    if (rc == SQLITE_DONE) return Step::end;
    if (rc != SQLITE_ROW) return after_error(rc);
    if (by_rowid_) {
      // A crafted file cannot make the walk go backwards or stand still.
      if (sqlite3_column_type(rows_.get(), 0) != SQLITE_INTEGER || sqlite3_column_int64(rows_.get(), 0) <= cursor_)
        throw CacheError(fmt::format("cache {}: table {} returns rows out of rowid order", src_.path(),
                                     table_name(table_)));
      cursor_ = sqlite3_column_int64(rows_.get(), 0);
    }
    const int n = sqlite3_column_count(rows_.get());
    row.clear();
    for (int c = 1; c < n; ++c) row.push_back(read_value(rows_.get(), c));
    return Step::row;
  }
}

}  // namespace moeblaze::cache_detail
