# Sourced by every */train_rtx5090.sh: the one rule for "re-running continues the run".
# Sets RESUME=(--resume auto) unless the arguments already choose: --resume/--resume_from PATH,
# --init_from (a new run from weights) or --overwrite (start over).
RESUME=(--resume auto)
for _arg in "$@"; do
  case "$_arg" in
    --resume|--resume=*|--resume_from|--resume_from=*|--init_from|--init_from=*|--overwrite) RESUME=() ;;
  esac
done
unset _arg
