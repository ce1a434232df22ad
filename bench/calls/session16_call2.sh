#!/usr/bin/env bash
# Session 16, call 2 (mid-session): branch mid16 = main 6580b05 + kda16 + lora16 + swiglu16 merged
# (packed from that tree). Issue 12's KDA core share of the step (bench/calls/kda_share.sh), then
# the three helpers' requests (bench/calls/session16_req_*.sh).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
. bench/calls/kda_share.sh
unpack
el share; kda_share; pack
for n in kda16 lora16 swiglu16; do
  el "$n"; mkdir -p "$L/$n"; ( L="$L/$n"; . bench/calls/session16_req_$n.sh ); pack
done
el done
