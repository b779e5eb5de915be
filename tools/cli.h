/* `kvp` subcommands: each takes argc/argv after the subcommand name and returns the
 * process exit status (0 ok, 1 runtime error, 2 usage error). */
#ifndef KVP_CLI_H
#define KVP_CLI_H

int kvp_cmd_generate(int argc, char **argv);
int kvp_cmd_synth(int argc, char **argv);
int kvp_cmd_quantize(int argc, char **argv);
int kvp_cmd_policy_init(int argc, char **argv);
int kvp_cmd_trace(int argc, char **argv);
int kvp_cmd_eval(int argc, char **argv);
int kvp_cmd_forkeval(int argc, char **argv);
int kvp_cmd_plot(int argc, char **argv);
int kvp_cmd_train(int argc, char **argv);
int kvp_cmd_calibrate(int argc, char **argv);
int kvp_cmd_fit_window(int argc, char **argv);
int kvp_cmd_learn(int argc, char **argv);
/* kvp learn --transcripts DIR (tools/cmd_learn_transcripts.c): 3 when nothing was installed. */
int kvp_cmd_learn_transcripts(int argc, char **argv);
int kvp_cmd_logits(int argc, char **argv);
int kvp_cmd_tokenize(int argc, char **argv);
int kvp_cmd_render(int argc, char **argv);

#endif
