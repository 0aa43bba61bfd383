@echo off
REM Runs one trainer with its RTX 5090 preset: shell\train_rtx5090.bat {vocoder^|tts^|vae} [extra args]
setlocal
set "HERE=%~dp0.."
set "TRAINER=%~1"
if "%TRAINER%"=="" goto usage
if /I "%TRAINER%"=="vocoder" goto run
if /I "%TRAINER%"=="tts" goto run
if /I "%TRAINER%"=="vae" goto run
echo error: unknown trainer "%TRAINER%" 1>&2
:usage
echo usage: %~nx0 {vocoder^|tts^|vae} [extra trainer args] 1>&2
exit /b 2
:run
REM Everything after the trainer name goes through as typed (%* keeps "--set key=value" whole; a
REM %1/shift loop would split it at "="): cut the first word off the full argument line.
set "ARGS=%*"
call set "ARGS=%%ARGS:*%1=%%"
call "%HERE%\%TRAINER%\train_rtx5090.bat" %ARGS%
exit /b %ERRORLEVEL%
