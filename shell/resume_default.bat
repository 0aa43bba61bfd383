@echo off
REM Called by every *\train_rtx5090.bat: the one rule for "re-running continues the run".
REM Sets RESUME=--resume auto unless the arguments already choose: --resume/--resume_from PATH,
REM --init_from (a new run from weights) or --overwrite (start over).
set "RESUME=--resume auto"
echo %* | findstr /C:"--resume" /C:"--init_from" /C:"--overwrite" >nul && set "RESUME="
exit /b 0
