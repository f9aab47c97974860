/*
 * cli/commands.h — the entry point of every `flatshard <command>`.
 *
 * Each command takes argc/argv with argv[0] = its own name, parses its option table
 * (cli/args.h), and returns an exit code: 0 success, 1 runtime error, 2 usage error. Only
 * code under cli/ prints for humans or decides exit codes.
 */
#ifndef FLATSHARD_CLI_COMMANDS_H
#define FLATSHARD_CLI_COMMANDS_H

int fs_cmd_train(int argc, char **argv);
int fs_cmd_eval(int argc, char **argv);
int fs_cmd_generate(int argc, char **argv);
int fs_cmd_tokenize(int argc, char **argv);
int fs_cmd_detokenize(int argc, char **argv);
int fs_cmd_export(int argc, char **argv);
int fs_cmd_inspect(int argc, char **argv);
int fs_cmd_plan(int argc, char **argv);
int fs_cmd_trace_svg(int argc, char **argv);
int fs_cmd_bench(int argc, char **argv);
int fs_cmd_bench_comm(int argc, char **argv); /* `flatshard bench comm`, cli/cmd_bench_comm.c */
int fs_cmd_bench_kernels(int argc, char **argv); /* `flatshard bench kernels`, cli/cmd_bench_kernels.c */

/* Prints "flatshard <cmd>: <error message of the calling thread>" to stderr and returns the
 * exit code for the status: 2 for FS_ERR_USAGE, 1 for everything else. */
int fs_cli_report(const char *cmd, int status);

#endif /* FLATSHARD_CLI_COMMANDS_H */
