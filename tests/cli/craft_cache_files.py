#!/usr/bin/env python3
"""Makes the damaged and crafted cache files the CLI tests feed to `moeblaze cache`, with
plain SQLite (the standard library's sqlite3), behind the cache's back.

  damage FILE          overwrite one overflow page of a binary's blob
  readable FILE        print how many binaries plain SQLite can still read, id by id
  recursive-view FILE  turn the binaries table of an export into a recursive view
  bad-rows FILE        one binary with a wrong checksum, one with an escape sequence in its name
"""
import sqlite3
import sys

PAGE = 4096


def pages(path, table, kind):
    db = sqlite3.connect(path)
    try:
        return [r[0] for r in db.execute(
            "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = ? ORDER BY pageno", (table, kind))]
    except sqlite3.OperationalError:  # SQLite built without dbstat: the pages after the schema
        return [3, 4]
    finally:
        db.close()


def overwrite(path, page):
    with open(path, "r+b") as f:
        f.seek((page - 1) * PAGE)
        f.write(b"\xff" * PAGE)


def damage(path):
    overflow = pages(path, "binaries", "overflow")
    targets = [overflow[len(overflow) // 2]] if overflow else [3]
    for p in targets:
        overwrite(path, p)


def readable(path):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    n = 0
    for rowid in range(1, 10000):
        try:
            n += len(db.execute("SELECT key, cubin FROM binaries WHERE rowid = ?", (rowid,)).fetchall())
        except sqlite3.DatabaseError:
            pass
    print(n)


def recursive_view(path):
    db = sqlite3.connect(path)
    db.executescript("ALTER TABLE binaries RENAME TO b0; CREATE VIEW binaries AS WITH RECURSIVE r(i) AS "
                     "(SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT b0.* FROM r, b0;")
    db.commit()
    db.close()


def bad_rows(path):
    db = sqlite3.connect(path)
    ids = [r[0] for r in db.execute("SELECT rowid FROM binaries ORDER BY rowid LIMIT 2")]
    db.execute("UPDATE binaries SET checksum = '0123456789abcdef' WHERE rowid = ?", (ids[0],))
    db.execute("UPDATE binaries SET kernel_name = 'mb_x' || char(27) || '[2J' WHERE rowid = ?", (ids[1],))
    db.commit()
    db.close()


if __name__ == "__main__":
    action, file = sys.argv[1], sys.argv[2]
    {"damage": damage, "readable": readable, "recursive-view": recursive_view, "bad-rows": bad_rows}[action](file)
