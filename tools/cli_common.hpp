// Shared pieces of every phasekv command-line tool: range-checked numeric flags whose errors
// name the flag, the value as typed and the range --help shows; the exit statuses; the memory
// a run may use; output files written to a temporary file and renamed on success. Internal to
// tools/, not part of the installed headers.
//
// Exit statuses: 0 success, 1 the run failed (bad input data, a file that cannot be read or
// written, out of memory), 2 the command line was refused before anything ran (a flag's value,
// a combination of flags, or a run that would not fit in memory).
#pragma once

#include "cli_flags.hpp"
#include "cli_main.hpp"
#include "cli_memory.hpp"
#include "cli_output_files.hpp"
#include "cli_temp_files.hpp"
