#!/usr/bin/env bash
# Runs a command that must fail: passes when it exits non-zero within the time limit and its
# output matches the pattern. Usage: expect_failure.sh SECONDS PATTERN command...
limit=$1; pattern=$2; shift 2
out=$(timeout "$limit" "$@" 2>&1); rc=$?
echo "$out"
if [ $rc -eq 0 ]; then echo "expect_failure: command succeeded"; exit 1; fi
if [ $rc -eq 124 ]; then echo "expect_failure: no exit within ${limit} s"; exit 1; fi
if ! grep -qE "$pattern" <<<"$out"; then echo "expect_failure: output lacks /$pattern/"; exit 1; fi
echo "expect_failure: exit $rc with /$pattern/ as expected"
