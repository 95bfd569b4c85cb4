#!/usr/bin/env bash
# Runs the libFuzzer targets built by `make fuzz-build`.
#
#   tests/fuzz/run.sh BUILD_DIR SECONDS TARGET...
#
# For each TARGET (key_header, json, ...): first replays the saved
# reproducers in tests/fuzz/crashes/TARGET/ (each must now run clean), then
# fuzzes for SECONDS starting from a copy of tests/fuzz/corpus/TARGET/, so
# the run never writes into the source tree. Any crash, leak, sanitizer report, timeout or
# out-of-memory fails the target; its reproducer is kept under
# BUILD_DIR/artifacts/TARGET/ and shown as a hex dump. Exits non-zero if any
# target failed.
set -uo pipefail

if [ $# -lt 3 ]; then
	echo "usage: $0 BUILD_DIR SECONDS TARGET..." >&2
	exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd) || exit 2
seconds=$2
shift 2

work=$(mktemp -d "${TMPDIR:-/tmp}/idemproxy-fuzz.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT

# Sanitizer findings must end the run, not scroll past.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=0:strict_string_checks=1:detect_stack_use_after_return=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# Leaks inside libraries we link, each explained in the file.
export LSAN_OPTIONS="suppressions=$here/../lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

# Inputs larger than a few KiB add nothing for these parsers but time.
FUZZ_FLAGS=(-rss_limit_mb=1024 -malloc_limit_mb=512 -timeout=10
	-max_len=8192 -print_final_stats=1)

passed=0
failed=0
failures=()

show_reproducer() {
	local f=$1
	echo "--- reproducer $f ($(stat -c %s "$f") bytes):"
	xxd "$f" | head -n 32
}

# Saved reproducers of crashes found earlier: a regression test each.
replay_crashes() {
	local t=$1 bin=$2 f rc=0
	local dir="$here/crashes/$t"
	[ -d "$dir" ] || return 0
	for f in "$dir"/*; do
		[ -f "$f" ] || continue
		if ! "$bin" "${FUZZ_FLAGS[@]}" "$f" >"$work/$t.replay.log" 2>&1; then
			echo "FAIL fuzz_$t: saved reproducer still fails: $f"
			grep -E 'ERROR|SUMMARY|assertion|runtime error' \
				"$work/$t.replay.log" | head -n 10
			show_reproducer "$f"
			rc=1
		fi
	done
	return $rc
}

fuzz_one() {
	local t=$1 bin=$2
	local dir="$work/$t"
	local dict=()
	mkdir -p "$dir/corpus" "$dir/artifacts"
	cp -R "$here/corpus/$t/." "$dir/corpus/"
	[ -f "$here/dict/$t.dict" ] && dict=(-dict="$here/dict/$t.dict")
	"$bin" "${FUZZ_FLAGS[@]}" "${dict[@]}" -max_total_time="$seconds" \
		-artifact_prefix="$dir/artifacts/" "$dir/corpus" \
		>"$dir/log" 2>&1
	local rc=$?
	local found
	found=$(find "$dir/artifacts" -type f | head -n 5)
	if [ $rc -eq 0 ] && [ -z "$found" ]; then
		local execs cov
		execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log")
		cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$dir/log" | tail -n 1)
		echo "ok   fuzz_$t: ${execs:-?} runs in ${seconds}s, $cov"
		return 0
	fi
	echo "FAIL fuzz_$t (exit $rc); end of its log:"
	grep -v '^#[0-9]' "$dir/log" | tail -n 40
	mkdir -p "$build/artifacts/$t"
	for f in $found; do
		cp "$f" "$build/artifacts/$t/"
		show_reproducer "$build/artifacts/$t/$(basename "$f")"
	done
	return 1
}

for t in "$@"; do
	bin="$build/fuzz_$t"
	if [ ! -x "$bin" ]; then
		echo "FAIL fuzz_$t: $bin not built"
		failed=$((failed + 1))
		failures+=("$t")
		continue
	fi
	ok=1
	replay_crashes "$t" "$bin" || ok=0
	fuzz_one "$t" "$bin" || ok=0
	if [ $ok -eq 1 ]; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
		failures+=("$t")
	fi
done

[ $failed -gt 0 ] && echo "failed targets: ${failures[*]}"
echo "fuzz: $passed passed, $failed failed"
[ $failed -eq 0 ]
