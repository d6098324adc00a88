# Sourced by the Soft-RoCE ping-pong benches (bench/softroce.sh,
# bench/softroce_cross.sh) after softroce_bench.sh: turns the guests'
# "@ KEY k=v ... json=..." lines in $out into rows, and prints them.
# A row NAME is ok[NAME]=1 with rate (round trips/s), p50 and p99 (us), or
# ok[NAME]=0 with why[NAME]; note[NAME] says which transport each end logged.
# shellcheck shell=bash
declare -A ok rate p50 p99 why note
declare -A label=(
	[tcp]="tcpPingPong (kernel TCP)"
	[auto]="rdmashim run tcpPingPong (auto)"
	[shim]="rdmashim run tcpPingPong (verbs)"
	[sleep]="  the same, no spin (RDMASHIM_SPIN_US=0)"
	[rspreload]="librspreload tcpPingPong (rsocket)"
	[core]="rdmaPingPong --transport verbs"
	[ibl]="ib_write_lat (perftest) [1]"
)

# pingpong_row KEY NAME EXPECTED: the ping-pong of results KEY.client and
# KEY.server as row NAME. EXPECTED: "" (any transport), verbs (both ends),
# or what the client must have logged (tcp:policy).
pingpong_row() {
	local c s j t st w
	c=$(result "$out" "$1.client") s=$(result "$out" "$1.server")
	j=$(kv "$c" json) t=$(kv "$c" transport) st=$(kv "$s" transport)
	ok[$2]=0 rate[$2]="" p50[$2]="" p99[$2]="" note[$2]=""
	if [[ $(kv "$c" rc) != 0 || -z $(jf "$j" round_trips_per_s) ]]; then
		why[$2]="exit $(kv "$c" rc): $(kv "$c" log | tr '|_' '  ' | cut -c1-120)"
	elif [[ -n $3 && $t != "$3" ]]; then
		why[$2]="client logged ${t:-nothing} (server ${st:-nothing}), expected $3"
	elif [[ $3 == verbs && $st != verbs ]]; then
		why[$2]="server logged ${st:-nothing}, expected verbs"
	else
		ok[$2]=1 rate[$2]=$(jf "$j" round_trips_per_s) p50[$2]=$(jf "$j" p50_us) p99[$2]=$(jf "$j" p99_us)
		if [[ -n $t ]]; then
			w=$(kv "$c" why)
			note[$2]="client $t${w:+ (${w//_/ })}, server $st"
		fi
	fi
}

# ib_write_lat_row KEY: perftest's ib_write_lat as row ibl. It reports
# one-way latency, half the round trip of its write ping-pong, so: round
# trips/s = 1e6 / (2 * t_avg), p50 = 2 * t_typical (its median), p99 = 2 *
# its 99% percentile. ibl_note: its own figures.
ib_write_lat_row() {
	local c raw ttyp tavg t99
	c=$(result "$out" "$1.client")
	raw=$(kv "$c" raw)
	ok[ibl]=0 rate[ibl]="" p50[ibl]="" p99[ibl]="" note[ibl]=""
	if [[ $(kv "$c" rc) == 0 && $raw == *,*,* ]]; then
		IFS=, read -r _ _ _ _ ttyp tavg _ t99 _ <<<"$raw"
		ok[ibl]=1
		rate[ibl]=$(awk -v a="$tavg" 'BEGIN { printf "%.1f", 1e6 / (2 * a) }')
		p50[ibl]=$(awk -v a="$ttyp" 'BEGIN { printf "%.3f", 2 * a }')
		p99[ibl]=$(awk -v a="$t99" 'BEGIN { printf "%.3f", 2 * a }')
		ibl_note="ib_write_lat one-way: t_typical $ttyp us, t_avg $tavg us, 99% $t99 us"
	else
		why[ibl]="exit $(kv "$c" rc): $(kv "$c" log | tr '|_' '  ' | cut -c1-120)"
		ibl_note="ib_write_lat failed"
	fi
}

# rate_ratio RATE BASE_ROW -> "0.38x", or "-" when the base row failed.
rate_ratio() {
	[[ -n $1 && ${ok[$2]} == 1 ]] || { echo -; return; }
	awk -v a="$1" -v b="${rate[$2]}" 'BEGIN { printf "%.2fx", a / b }'
}
# json_ratio RATE BASE_ROW -> the same as a JSON number, or null.
json_ratio() { rate_ratio "$1" "$2" | tr -d x | sed 's/^-$/null/'; }

# print_rows TITLE BASE1 LABEL1 BASE2 LABEL2: the table of rows[@], each
# rate with its ratio to rows BASE1 and BASE2.
print_rows() {
	local r w1=$((${#3} + 2)) w2=$((${#5} + 1))
	((w1 >= 8)) || w1=8
	((w2 >= 8)) || w2=8
	printf '\n%s\n\n' "$1"
	printf "%-36s %14s %10s %10s %${w1}s %${w2}s\n" what "round trips/s" "p50 us" "p99 us" "$3" "$5"
	for r in "${rows[@]}"; do
		if [[ ${ok[$r]} == 1 ]]; then
			printf "%-36s %14.0f %10.1f %10.1f %${w1}s %${w2}s\n" "${label[$r]}" "${rate[$r]}" "${p50[$r]}" "${p99[$r]}" \
				"$(rate_ratio "${rate[$r]}" "$2")" "$(rate_ratio "${rate[$r]}" "$4")"
		else
			printf '%-36s failed: %s\n' "${label[$r]}" "${why[$r]}"
		fi
	done
}

# rows_json HEAD BASE1 KEY1 BASE2 KEY2: one JSON object, HEAD's fields then
# "rows" (each with its ratios to BASE1 and BASE2 as KEY1 and KEY2).
rows_json() {
	local r sep=""
	printf '{%s,"rows":[' "$1"
	for r in "${rows[@]}"; do
		if [[ ${ok[$r]} == 1 ]]; then
			printf '%s{"row":"%s","what":"%s","ok":true,"round_trips_per_s":%s,"p50_us":%s,"p99_us":%s,"%s":%s,"%s":%s}' \
				"$sep" "$r" "${label[$r]}" "${rate[$r]}" "${p50[$r]}" "${p99[$r]}" \
				"$3" "$(json_ratio "${rate[$r]}" "$2")" "$5" "$(json_ratio "${rate[$r]}" "$4")"
		else
			printf '%s{"row":"%s","what":"%s","ok":false,"error":"%s"}' "$sep" "$r" "${label[$r]}" "${why[$r]//\"/\'}"
		fi
		sep=,
	done
	printf ']}\n'
}
